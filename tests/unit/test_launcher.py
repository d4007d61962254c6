import pytest

from launcher.srun import LaunchError, plan_launch


def which(name):
    return f"/usr/bin/{name}"


def test_inside_allocation():
    plan = plan_launch(["-n", "4", "python", "train.py"],
                       {"SLURM_JOB_ID": "42", "MALLEABLE_RUN_DIR": "/s"}, which=which,
                       is_dir=lambda p: str(p) == "/s/jobs/job_42")
    assert plan.argv == ["/usr/bin/srun", "--mpi=pmix", "--cpu-bind=none", "-n", "4", "python",
                         "train.py"]
    assert plan.env == {"MALLEABLE_TF_STATUS": "/s/jobs/job_42/rank_{rank}.json",
                        "MALLEABLE_TF_TARGET": "/s/targets/job_42.{node}.json",
                        "MALLEABLE_TF_ALLOWANCE": "cgroup", "MALLEABLE_TF_MAX_THREADS": "node"}
    assert str(plan.status_dir) == "/s/jobs/job_42"


def test_without_the_prologs_folder_ranks_write_no_status():
    plan = plan_launch(["python", "x.py"], {"SLURM_JOB_ID": "42"}, which=which,
                       is_dir=lambda p: False)
    assert "MALLEABLE_TF_STATUS" not in plan.env and plan.status_dir is None
    assert plan.env["MALLEABLE_TF_TARGET"] == "/run/malleable/targets/job_42.{node}.json"


def test_outside_allocation_says_so():
    with pytest.raises(LaunchError, match="not inside a Slurm allocation"):
        plan_launch(["python", "x.py"], {}, which=which)
    with pytest.raises(LaunchError, match="not a job id"):
        plan_launch(["python", "x.py"], {"SLURM_JOB_ID": "1/../2"}, which=which)


def test_refuses_a_cpu_binding():
    with pytest.raises(LaunchError, match="cpu-bind"):
        plan_launch(["--cpu-bind=cores", "x"], {"SLURM_JOB_ID": "1"}, which=which)


def test_local_mode():
    plan = plan_launch(["--local", "2", "python", "x.py"], {}, which=which)
    assert plan.argv[:5] == ["/usr/bin/mpirun", "-np", "2", "--bind-to", "none"]
    assert plan.argv[-2:] == ["python", "x.py"]
    assert plan.status_dir.is_dir()
    plan.status_dir.rmdir()
    for bad in (["--local"], ["--local", "x", "p"], ["--local", "0", "p"]):
        with pytest.raises(LaunchError):
            plan_launch(bad, {}, which=which)
