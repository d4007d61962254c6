import pytest

from launcher.srun import LaunchError, plan_launch


def which(name):
    return f"/usr/bin/{name}"


def test_inside_allocation():
    plan = plan_launch(["-n", "4", "python", "train.py"],
                       {"SLURM_JOB_ID": "42", "MALLEABLE_STATUS_BASE": "/s"}, which=which,
                       max_threads_of=lambda job, env: 8)
    assert plan.argv == ["/usr/bin/srun", "--mpi=pmix", "--cpu-bind=none", "-n", "4", "python",
                         "train.py"]
    assert plan.env == {"MALLEABLE_TF_STATUS": "/s/job_42/rank_{rank}.json",
                        "MALLEABLE_TF_TARGET": "/s/job_42/target-{node}.json",
                        "MALLEABLE_TF_ALLOWANCE": "cgroup", "MALLEABLE_TF_MAX_THREADS": "8"}


def test_outside_allocation_says_so():
    with pytest.raises(LaunchError, match="not inside a Slurm allocation"):
        plan_launch(["python", "x.py"], {}, which=which)


def test_refuses_a_cpu_binding():
    with pytest.raises(LaunchError, match="cpu-bind"):
        plan_launch(["--cpu-bind=cores", "x"], {"SLURM_JOB_ID": "1"}, which=which,
                    max_threads_of=lambda j, e: 2)


def test_local_mode():
    plan = plan_launch(["--local", "2", "python", "x.py"], {}, which=which)
    assert plan.argv[:5] == ["/usr/bin/mpirun", "-np", "2", "--bind-to", "none"]
    assert plan.argv[-2:] == ["python", "x.py"]
    for bad in (["--local"], ["--local", "x", "p"], ["--local", "0", "p"]):
        with pytest.raises(LaunchError):
            plan_launch(bad, {}, which=which)
