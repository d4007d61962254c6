from pathlib import Path

import pytest

from malleable_runtime.srun import (LaunchError, has_pmix, is_python, plan_launch,
                                    split_srun_options, with_runner)

RUN = ["-m", "malleable_tf.run"]


def which(name):
    return f"/usr/bin/{name}"


def test_inside_allocation():
    plan = plan_launch(["-n", "4", "python", "train.py"],
                       {"SLURM_JOB_ID": "42", "MALLEABLE_RUN_DIR": "/s"}, which=which, pmix=lambda srun: True,
                       is_dir=lambda p: str(p) == "/s/jobs/job_42")
    # An unchanged script runs malleably: python SCRIPT becomes python -m malleable_tf.run SCRIPT.
    assert plan.argv == ["/usr/bin/srun", "--cpu-bind=none", "-n", "4", "python", *RUN,
                         "train.py"]
    assert plan.env == {"MALLEABLE_TF_STATUS": "/s/jobs/job_42/rank_{rank}.{step}.json",
                        "MALLEABLE_TF_TARGET": "/s/targets/job_42.{node}.json",
                        "MALLEABLE_TF_ALLOWANCE": "cgroup", "MALLEABLE_TF_MAX_THREADS": "node"}
    assert str(plan.status_dir) == "/s/jobs/job_42"


@pytest.mark.parametrize("source,horovod", [
    ("import horovod.tensorflow as hvd\n", True),
    ("import malleable_tf.horovod as mh\n", True),
    ("def main():\n    import horovod.tensorflow.keras as hvd\n", True),
    ("import tensorflow as tf\nstrategy = tf.distribute.MultiWorkerMirroredStrategy()\n", False),
    ("import torch.distributed as dist\n", False),
])
def test_only_a_horovod_script_gets_pmix_else_the_sites_mpi_default(tmp_path, source, horovod):
    """Horovod's ranks meet through Open MPI, which needs PMIx under srun: --mpi=pmix where this
    Slurm has it. Anything else runs with the site's MpiDefault, as under plain srun."""
    script = tmp_path / "train.py"
    script.write_text(source)
    env = {"SLURM_JOB_ID": "42"}

    def argv(options=(), environ=None, pmix=True):
        return plan_launch([*options, "python", str(script)], {**env, **(environ or {})},
                           which=which, pmix=lambda srun: pmix).argv
    assert ("--mpi=pmix" in argv()) is horovod
    assert argv(pmix=False)[:2] == ["/usr/bin/srun", "--cpu-bind=none"]
    # Told otherwise: the user's --mpi or srun's own SLURM_MPI_TYPE.
    assert argv(["--mpi=pmi2"])[:3] == ["/usr/bin/srun", "--cpu-bind=none", "--mpi=pmi2"]
    assert argv(environ={"SLURM_MPI_TYPE": "pmi2"})[:3] == ["/usr/bin/srun", "--cpu-bind=none",
                                                           "python"]


def test_the_pmix_plugin_is_read_from_srun_mpi_list(tmp_path):
    """srun --mpi=list as 26.05 prints it (Debian sid: no pmix; captured) and as 22.05 does
    (on stderr)."""
    def srun(stdout, stderr):
        path = tmp_path / "srun"
        path.write_text(f"#!/bin/sh\nprintf '{stdout}'\nprintf '{stderr}' >&2\n")
        path.chmod(0o755)
        return str(path)
    sid = (Path(__file__).parents[2] / "fixtures" / "slurm-26.05" / "srun_mpi_list.txt")
    assert not has_pmix(srun(sid.read_text().replace("\t", "\\t").replace("\n", "\\n"), ""))
    assert has_pmix(srun("", "srun: MPI types are...\nsrun: none\nsrun: pmix\nsrun: pmi2\n"))
    assert has_pmix(srun("MPI plugin types are...\n\tnone\n\tpmix\nspecific pmix plugin "
                         "versions available: pmix_v5\n", ""))
    assert not has_pmix(str(tmp_path / "no-srun"))


def test_without_the_prologs_folder_ranks_write_no_status():
    plan = plan_launch(["python", "x.py"], {"SLURM_JOB_ID": "42"}, which=which, pmix=lambda srun: True,
                       is_dir=lambda p: False)
    assert "MALLEABLE_TF_STATUS" not in plan.env and plan.status_dir is None
    assert plan.env["MALLEABLE_TF_TARGET"] == "/run/malleable/targets/job_42.{node}.json"


def test_outside_allocation_says_so():
    with pytest.raises(LaunchError, match="not inside a Slurm allocation"):
        plan_launch(["python", "x.py"], {}, which=which, pmix=lambda srun: True)
    with pytest.raises(LaunchError, match="not a job id"):
        plan_launch(["python", "x.py"], {"SLURM_JOB_ID": "1/../2"}, which=which, pmix=lambda srun: True)


def test_a_binding_of_the_users_own_is_kept():
    plan = plan_launch(["--cpu-bind=cores", "x"], {"SLURM_JOB_ID": "1"}, which=which,
                       pmix=lambda srun: True)
    assert plan.argv == ["/usr/bin/srun", "--cpu-bind=cores", "x"]


def test_a_pytorch_script_gets_no_mpi_plugin(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text("import torch.distributed as dist\n")
    plan = plan_launch(["-n", "2", "python", str(script)], {"SLURM_JOB_ID": "1"}, which=which,
                       pmix=lambda srun: True)
    assert plan.argv == ["/usr/bin/srun", "--cpu-bind=none", "-n", "2", "python", "-m",
                         "malleable_torch.run", str(script)]


def test_local_mode():
    plan = plan_launch(["--local", "2", "python", "x.py"], {}, which=which, pmix=lambda srun: True)
    assert plan.argv[:5] == ["/usr/bin/mpirun", "-np", "2", "--bind-to", "none"]
    assert plan.argv[-4:] == ["python", *RUN, "x.py"]
    assert plan.status_dir.is_dir()
    plan.status_dir.rmdir()
    for bad in (["--local"], ["--local", "x", "p"], ["--local", "0", "p"]):
        with pytest.raises(LaunchError):
            plan_launch(bad, {}, which=which, pmix=lambda srun: True)


def srun_argv(args, environ=None):
    """What follows srun and the binding (these scripts do not exist: no --mpi either)."""
    argv = plan_launch(args, {"SLURM_JOB_ID": "7", **(environ or {})}, which=which,
                       pmix=lambda srun: True, is_dir=lambda p: False).argv
    assert argv[:2] == ["/usr/bin/srun", "--cpu-bind=none"], argv
    return argv[2:]


@pytest.mark.parametrize("args,options", [
    (["python", "t.py"], []),
    (["-n", "4", "python", "t.py"], ["-n", "4"]),
    (["-n4", "python", "t.py"], ["-n4"]),
    (["-N", "2", "-c", "2", "-w", "node1", "python", "t.py"],
     ["-N", "2", "-c", "2", "-w", "node1"]),
    (["-o", "out", "-J", "name", "-t", "10", "-p", "debug", "python", "t.py"],
     ["-o", "out", "-J", "name", "-t", "10", "-p", "debug"]),
    (["-lN", "2", "python", "t.py"], ["-lN", "2"]),          # a cluster: N ends it, takes the next
    (["-lN2", "python", "t.py"], ["-lN2"]),
    (["-l", "-u", "python", "t.py"], ["-l", "-u"]),           # flags take nothing
    (["--ntasks", "4", "--nodes=2", "python", "t.py"], ["--ntasks", "4", "--nodes=2"]),
    (["--ntasks-per-node", "2", "python", "t.py"], ["--ntasks-per-node", "2"]),
    (["--exclusive", "--label", "python", "t.py"], ["--exclusive", "--label"]),  # optional value
    (["--ntask", "4", "python", "t.py"], ["--ntask", "4"]),   # getopt_long takes a prefix
    (["--made-up", "python", "t.py"], ["--made-up"]),        # unknown: no value
    (["-n", "2", "--", "python", "t.py"], ["-n", "2", "--"]),
])
def test_srun_options_are_told_apart_from_the_program(args, options):
    assert split_srun_options(args) == (options, args[len(options):])
    assert srun_argv(args) == [*options, "python", *RUN, "t.py"]


@pytest.mark.parametrize("command,wrapped", [
    (["python", "t.py", "-n", "4"], ["python", *RUN, "t.py", "-n", "4"]),
    (["python3", "t.py"], ["python3", *RUN, "t.py"]),
    (["/opt/venv/bin/python3.11", "dir/t.py"], ["/opt/venv/bin/python3.11", *RUN, "dir/t.py"]),
    (["python", "-u", "-W", "ignore", "t.py"], ["python", "-u", "-W", "ignore", *RUN, "t.py"]),
    (["python", "-Wignore", "-X", "dev", "-OO", "t.py"],
     ["python", "-Wignore", "-X", "dev", "-OO", *RUN, "t.py"]),
    (["python", "--", "t.py"], ["python", *RUN, "--", "t.py"]),
    # Not a script: left alone.
    (["python", "-m", "train"], None), (["python", "-um", "train"], None),
    (["python", "-c", "print(1)"], None), (["python"], None), (["python", "-"], None),
    (["python", "-u"], None), (["python", "--version"], None), (["python", "-V"], None),
    (["./train.sh", "t.py"], None), (["ipython", "t.py"], None), (["python3-config", "x"], None),
    (["pythonista", "t.py"], None),
])
def test_python_scripts_are_run_through_the_runner(command, wrapped):
    assert with_runner(command) == (wrapped or command)
    assert srun_argv(["-n", "1", *command]) == ["-n", "1", *(wrapped or command)]


def test_is_python():
    assert all(map(is_python, ["python", "python3", "python3.11", "/usr/bin/python3", "./python"]))
    assert not any(map(is_python, ["python3.11-config", "jython", "python-", "py", "/python/x"]))


def test_opting_out_of_the_runner():
    plain = ["-n", "2", "python", "t.py"]
    assert srun_argv(["--no-auto-init", *plain]) == plain
    for value in ("0", "no", "false", "OFF"):
        assert srun_argv(plain, {"MALLEABLE_TF_AUTO_INIT": value}) == plain
    assert srun_argv(plain, {"MALLEABLE_TF_AUTO_INIT": "1"}) == ["-n", "2", "python", *RUN, "t.py"]
    # --no-auto-init is malleable-srun's: it never reaches srun, in either order with --local.
    for args in (["--no-auto-init", "--local", "2", "python", "x.py"],
                 ["--local", "2", "--no-auto-init", "python", "x.py"]):
        plan = plan_launch(args, {}, which=which, pmix=lambda srun: True)
        plan.status_dir.rmdir()
        assert plan.argv[-2:] == ["python", "x.py"] and "--no-auto-init" not in plan.argv
    # After the program it is the program's own argument.
    assert srun_argv(["python", "t.py", "--no-auto-init"])[-1] == "--no-auto-init"


def test_multi_prog_and_programs_that_are_not_python_are_left_alone():
    assert srun_argv(["--multi-prog", "python", "conf"]) == ["--multi-prog", "python", "conf"]
    assert srun_argv(["-n", "2", "hostname"]) == ["-n", "2", "hostname"]


def test_a_cpu_binding_only_counts_among_srun_options():
    plan = plan_launch(["-n", "2", "--cpu-bind", "cores", "x"], {"SLURM_JOB_ID": "1"},
                       which=which, pmix=lambda srun: True)
    assert "--cpu-bind=none" not in plan.argv
    # The program's own --cpu-bind argument is its business.
    assert srun_argv(["python", "t.py", "--cpu-bind=x"])[-1] == "--cpu-bind=x"


def test_no_program_after_the_options():
    for args in (["-n", "4"], ["-n", "4", "--"], ["--ntasks", "4"]):
        with pytest.raises(LaunchError, match="no program"):
            plan_launch(args, {"SLURM_JOB_ID": "1"}, which=which, pmix=lambda srun: True)
    with pytest.raises(LaunchError, match="usage"):
        plan_launch(["--local", "2", "--no-auto-init"], {}, which=which, pmix=lambda srun: True)


# --- which framework's runner -------------------------------------------------------------------

SOURCES = {"tf.py": b"import os\nimport tensorflow as tf\n",
           "torch.py": b"import os\nimport torch.distributed as dist\nfrom torch import nn\n",
           "lit.py": b"from lightning.pytorch import Trainer\n",
           "both.py": b"import torch\nimport tensorflow\n",
           "none.py": b"print('hi')\n", "broken.py": b"def (:\n",
           "in_function.py": b"def main():\n    import torch\n"}


def read_source(path):
    try:
        return SOURCES[path]
    except KeyError:
        raise FileNotFoundError(path) from None


@pytest.mark.parametrize("script,runner", [
    ("tf.py", "malleable_tf.run"), ("torch.py", "malleable_torch.run"),
    ("lit.py", "malleable_torch.run"), ("both.py", "malleable_torch.run"),
    ("in_function.py", "malleable_torch.run"),
    # Nothing named, unparsable or unreadable: TensorFlow's, as before PyTorch's runner existed.
    ("none.py", "malleable_tf.run"), ("broken.py", "malleable_tf.run"),
    ("missing.py", "malleable_tf.run")])
def test_the_runner_is_the_framework_the_script_imports_first(script, runner):
    got = with_runner(["python3", "-u", script, "--x"], {}, read_source)
    assert got == ["python3", "-u", "-m", runner, script, "--x"]
    assert with_runner(["python", "--", script], {}, read_source) == \
        ["python", "-m", runner, "--", script]


def test_malleable_framework_says_it_outright():
    assert with_runner(["python", "tf.py"], {"MALLEABLE_FRAMEWORK": "torch"}, read_source) == \
        ["python", "-m", "malleable_torch.run", "tf.py"]
    assert with_runner(["python", "torch.py"], {"MALLEABLE_FRAMEWORK": "TensorFlow"},
                       read_source)[2] == "malleable_tf.run"
    with pytest.raises(LaunchError, match="MALLEABLE_FRAMEWORK must be tensorflow or torch"):
        with_runner(["python", "tf.py"], {"MALLEABLE_FRAMEWORK": "jax"}, read_source)
