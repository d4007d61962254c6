"""``python -m malleable_tf.run``: its command line, how it runs a script, and how a script's own
init() joins the runner's. No TensorFlow here: the runner's init is replaced by a stand-in."""
import os
import signal
import sys
from pathlib import Path

import pytest

import malleable_tf
from malleable_runtime import session
from malleable_runtime import runner as shared
from malleable_tf import run as runner
from malleable_tf import Action, MalleableError


def parse(args, files=("t.py",), modules=("pkg",)):
    return shared.parse_args(args, is_file=lambda p: p in files,
                             module_exists=lambda m: m.split(".")[0] in modules)


def test_parse_a_script_and_its_arguments():
    p = parse(["t.py", "-m", "x", "--help", "--"])
    assert (p.path, p.module, p.args) == ("t.py", None, ["-m", "x", "--help", "--"])
    assert p.argv == ["t.py", "-m", "x", "--help", "--"]
    assert parse(["--", "t.py", "a"]).argv == ["t.py", "a"]
    assert parse(["--", "-odd.py"], files=("-odd.py",)).path == "-odd.py"


def test_parse_a_module():
    p = parse(["-m", "pkg.train", "--epochs", "3"])
    assert (p.path, p.module, p.args) == (None, "pkg.train", ["--epochs", "3"])
    assert parse(["-mpkg", "a"]).argv == ["pkg", "a"]


def test_parse_help():
    assert parse(["-h"]) is None and parse(["--help", "t.py"]) is None


@pytest.mark.parametrize("args,message", [
    ([], "no script given"), (["--"], "no script given after --"),
    (["missing.py"], "missing.py: no such file"), (["-x", "t.py"], "unknown option '-x'"),
    (["-"], "standard input"), (["-m"], "-m needs a module name"),
    (["-m", "-u"], "-m needs a module name"), (["-m", "nothere.x"], "no module named 'nothere'"),
])
def test_parse_errors(args, message):
    with pytest.raises(shared.UsageError, match=message):
        parse(args)


def test_a_folder_is_not_a_script(tmp_path):
    with pytest.raises(shared.UsageError, match="is a folder"):
        shared.parse_args([str(tmp_path)])


@pytest.fixture
def fake_init(monkeypatch):
    """The runner's init() replaced: records its calls; sys.argv and sys.path restored after."""
    calls = []
    monkeypatch.setattr(runner, "init_from_launcher", lambda program=None: calls.append(1))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    return calls


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_runs_the_script_as_main_with_its_argv_and_folder(tmp_path, fake_init, capsys):
    write(tmp_path / "lib" / "helper_mod_for_run.py", "VALUE = 42\n")
    script = write(tmp_path / "lib" / "train.py", (
        "import sys, helper_mod_for_run\n"
        "print('argv', sys.argv)\n"
        "print('path0', sys.path[0])\n"
        "if __name__ == '__main__':\n    print('main', helper_mod_for_run.VALUE)\n"))
    try:
        assert runner.main([str(script), "--epochs", "2"]) == 0
    finally:
        sys.modules.pop("helper_mod_for_run", None)
    out = capsys.readouterr().out
    assert fake_init == [1]
    assert f"argv {[str(script), '--epochs', '2']}" in out
    assert f"path0 {script.parent}" in out and "main 42" in out


@pytest.mark.parametrize("code,expected", [("sys.exit(3)", 3), ("sys.exit('bad')", "bad"),
                                           ("sys.exit()", None)])
def test_the_scripts_exit_code_passes_through(tmp_path, fake_init, code, expected):
    script = write(tmp_path / "exit.py", f"import sys\n{code}\n")
    with pytest.raises(SystemExit) as info:
        runner.main([str(script)])
    assert info.value.code == expected


def test_an_exception_in_the_script_propagates(tmp_path, fake_init):
    script = write(tmp_path / "boom.py", "raise KeyError('boom')\n")
    with pytest.raises(KeyError, match="boom"):
        runner.main([str(script)])


def test_runs_a_module_like_python_m(tmp_path, fake_init, capsys, monkeypatch):
    write(tmp_path / "runpkg_for_test" / "__init__.py", "")
    write(tmp_path / "runpkg_for_test" / "train.py",
          "import sys\nprint('module', __name__, sys.argv[1:])\n")
    monkeypatch.chdir(tmp_path)
    try:
        assert runner.main(["-m", "runpkg_for_test.train", "a", "b"]) == 0
    finally:
        for name in ("runpkg_for_test", "runpkg_for_test.train"):
            sys.modules.pop(name, None)
    assert "module __main__ ['a', 'b']" in capsys.readouterr().out


def test_usage_errors_exit_2_before_init(fake_init, capsys):
    assert runner.main([]) == 2
    assert runner.main(["/no/such/script.py"]) == 2
    assert runner.main(["--bogus"]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "unknown option" in err and "usage:" in err
    assert fake_init == []
    assert runner.main(["--help"]) == 0 and fake_init == []


def test_a_failed_init_runs_nothing(tmp_path, monkeypatch, capsys):
    script = write(tmp_path / "t.py", "raise SystemExit('ran')\n")

    def bad_init(program=None):
        raise ValueError("MALLEABLE_TF_SPLIT must be active, eigen or pool, not 'x'")
    monkeypatch.setattr(runner, "init_from_launcher", bad_init)
    assert runner.main([str(script)]) == 1
    err = capsys.readouterr().err
    assert "init() failed" in err and "MALLEABLE_TF_SPLIT" in err and "not started" in err


# --- a second init() under the runner ---------------------------------------------------------

class FakeRuntime:
    def state(self):
        return "the running state"


@pytest.fixture
def joined(monkeypatch):
    """As after the runner's init(): a runtime, its settings, and joining allowed."""
    settings = {"max_threads": 2, "inter_max_threads": 2, "follow": True,
                "signals": {signal.SIGUSR1: Action.RELOAD}, "poll_interval_s": 0.005,
                "recheck_interval_s": 1.0, "status_path": Path("/s/rank_3.json"),
                "local_rank": 1, "local_size": 2, "rank": 3, "count_steps": True,
                "_fields": {"rank": 3, "local_rank": 1, "pid": 99, "job": "0", "node": "n"}}
    monkeypatch.setattr(session, "_running", FakeRuntime())
    monkeypatch.setattr(malleable_tf, "_settings", settings)
    monkeypatch.setattr(malleable_tf, "_joinable", True)


@pytest.mark.parametrize("kwargs", [
    {}, {"max_threads": 2}, {"inter_max_threads": 2, "follow": True}, {"rank": 3},
    {"local_rank": 1, "local_size": 2, "rank": 3},   # what malleable_tf.horovod.init passes
    {"signals": {int(signal.SIGUSR1): Action.RELOAD}}, {"poll_interval_s": 0.005},
    {"status_path": "/s/rank_{rank}.json"}, {"status_path": Path("/s/rank_3.json")},
    {"count_steps": True},
])
def test_a_second_init_that_agrees_returns_the_state(joined, kwargs):
    assert malleable_tf.init(**kwargs) == "the running state"


@pytest.mark.parametrize("kwargs,named", [
    ({"max_threads": 3}, "max_threads=3 (it runs with 2)"),
    ({"inter_max_threads": 1}, "inter_max_threads=1"), ({"follow": False}, "follow=False"),
    ({"rank": 0}, "rank=0"), ({"local_size": 1}, "local_size=1"),
    ({"max_threads": True}, "max_threads=True"),
    ({"signals": {signal.SIGUSR2: Action.RELOAD}}, "signals="),
    ({"poll_interval_s": 0.05}, "poll_interval_s=0.05"),
    ({"status_path": "/elsewhere/{rank}.json"}, "status_path="),
    ({"count_steps": False}, "count_steps=False"),
])
def test_a_second_init_that_asks_otherwise_is_a_clear_error(joined, kwargs, named):
    with pytest.raises(MalleableError, match="malleable_tf.run started it") as info:
        malleable_tf.init(**kwargs)
    assert named in str(info.value) and "--no-auto-init" in str(info.value)


def test_without_the_runner_a_second_init_still_raises(joined, monkeypatch):
    monkeypatch.setattr(malleable_tf, "_joinable", False)
    with pytest.raises(MalleableError, match="already ran$"):
        malleable_tf.init()


def test_the_runner_takes_the_ranks_from_the_launcher(monkeypatch):
    seen = {}

    def fake_init(**kwargs):
        seen.update(kwargs)
        return "state"
    for key in list(os.environ):
        if key.startswith(("OMPI_", "SLURM_", "HOROVOD_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3)")
    monkeypatch.setenv("SLURM_NODEID", "2")
    monkeypatch.setattr(malleable_tf, "init", fake_init)
    monkeypatch.setattr(malleable_tf, "_joinable", False)
    assert runner.init_from_launcher() == "state"
    assert seen == {"local_rank": 1, "local_size": 2, "rank": 5}
    assert malleable_tf._joinable
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "7")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    runner.init_from_launcher()
    assert seen == {"local_rank": 0, "local_size": 4, "rank": 7}
