import os
import subprocess
from pathlib import Path

import pytest

from sbatch_templates import TEMPLATES, TemplateError, parse_sets, render

GOLDEN = Path(__file__).parents[2] / "golden" / "sbatch"
FIXED = {"python": "/opt/venv/bin/python", "launcher": "/opt/venv/bin/malleable-srun"}


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs; UPDATE_GOLDEN=1 rewrites it after review"


def test_single_node_golden():
    golden("single-node.sbatch", render("single-node", {
        **FIXED, "program": "train.py", "args": "--epochs 5 --out 'my dir'", "ntasks": "2",
        "max_cpus": "4"}))


def test_multi_node_golden():
    golden("multi-node.sbatch", render("multi-node", {**FIXED, "program": "train.py",
                                                      "nodes": "2", "tasks_per_node": "2"}))


def test_multi_worker_golden():
    golden("multi-worker.sbatch", render("multi-worker", {
        **FIXED, "program": "examples/train_multiworker.py", "args": "--epochs 20"}))


def test_pytorch_ddp_golden():
    golden("pytorch-ddp.sbatch", render("pytorch-ddp", {
        **FIXED, "program": "examples/train_torch_ddp.py", "args": "--epochs 20"}))


def test_coschedule_golden():
    golden("coschedule.sbatch", render("coschedule", {**FIXED, "program": "train.py",
                                                      "nodelist": "n1", "weight": "2"}))


def test_hostile_shell_values_are_quoted_and_inert():
    text = render("single-node", {**FIXED, "program": "x.py; rm -rf /",
                                  "args": "$(touch /tmp/pwned) \"a b\" `id`"})
    golden("hostile.sbatch", text)
    line = text.splitlines()[-1]
    # bash parses the line into exactly these words, none of them run.
    words = subprocess.run(["bash", "-c", "printf '%s\\n' " + line.split(" ", 1)[1]],
                           capture_output=True, text=True).stdout.splitlines()
    assert words == ["/opt/venv/bin/malleable-srun", "/opt/venv/bin/python", "x.py; rm -rf /",
                     "$(touch", "/tmp/pwned)", "a b", "`id`"]
    assert not Path("/tmp/pwned").exists()


@pytest.mark.parametrize("key,value", [
    ("job_name", "a b"), ("job_name", "x\n#SBATCH --uid=0"), ("time", "forever"),
    ("ntasks", "0"), ("ntasks", "2; id"), ("output", "/tmp/a b"), ("max_cpus", "-1"),
    ("program", "a\nb"), ("args", "'unclosed"),
])
def test_bad_values_refused(key, value):
    with pytest.raises(TemplateError):
        render("single-node", {**FIXED, "program": "p.py", key: value})


def test_unknown_and_missing():
    with pytest.raises(TemplateError, match="needs program"):
        render("single-node", {})
    with pytest.raises(TemplateError, match="unknown"):
        render("single-node", {"program": "p", "colour": "red"})
    with pytest.raises(TemplateError, match="no template"):
        render("nope", {})
    with pytest.raises(TemplateError):
        render("single-node", {**FIXED, "program": "p", "min_cpus": "4", "max_cpus": "2"})
    assert parse_sets(["a=b=c", "x="]) == {"a": "b=c", "x": ""}
    with pytest.raises(TemplateError):
        parse_sets(["novalue"])


def test_every_template_renders_with_defaults():
    for name in TEMPLATES:
        text = render(name, {"program": "p.py", "nodelist": "n1"} if name == "coschedule"
                      else {"program": "p.py"})
        assert text.startswith("#!/bin/bash\n#SBATCH --job-name=")


def test_malleable_sbatch_passes_sbatch_options_through(monkeypatch, tmp_path, capsys):
    """Options after -- reach sbatch's command line (where they win over #SBATCH lines): the
    site's account, partition, memory, GRES and time, whatever the template has."""
    import tempfile

    from slurm_plugin.commands import common
    from slurm_plugin.commands.main import main

    submitted = []

    class Recorder:
        def submit(self, script, args=()):
            submitted.append((Path(script).read_text(), list(args)))
            return 42

    monkeypatch.setattr(common, "client", lambda args: Recorder())
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    options = ["--account=ml", "--partition", "cpu", "--mem=8G", "--gres=gpu:1",
               "--time=2:00:00"]
    assert main(["sbatch", "pytorch-ddp", "--set", "program=train.py", "--", *options]) == 0
    (script, args), = submitted
    assert args == options and "#SBATCH --malleable=1:node" in script
    assert "submitted job 42" in capsys.readouterr().out
    assert main(["sbatch", "single-node", "--set", "program=t.py", "--dry-run", "--",
                 "--account=ml"]) == 0
    assert capsys.readouterr().out.startswith("# sbatch --account=ml SCRIPT\n#!/bin/bash\n")
