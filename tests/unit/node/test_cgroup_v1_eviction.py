"""On this host's real cgroup v1 cpuset hierarchy, with a real unprivileged process (issue 40):
a task folder slurmstepd gives the job's user after the job was grown and sealed (v1 22.05
chowns the folder) lets him make a cpuset of his own in it, put the borrowed core in it and
keep re-writing it through a descriptor he holds open. Taking the core back then failed
(EBUSY: a v1 parent cannot drop a CPU a child holds), and the next job's Prolog on that core
failed closed. The actuator now takes his folder back (root's), moves his process up into
the Slurm folder and removes it, and the core comes back."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


from slurm_plugin.cgroups import CgroupVersion, SlurmCgroupLayout
from slurm_plugin.node.cgroup_actuator import CpusetActuator, read_cpus

MOUNT = Path("/sys/fs/cgroup")
USER = 4243
JOB = 7
S = frozenset


def _cgroup_v1_cpuset() -> bool:
    return (MOUNT / "cpuset" / "cpuset.cpus").is_file() and \
        len(read_cpus(MOUNT / "cpuset") or ()) >= 2


def _make(folder: Path, cpus: str, mems: str) -> None:
    folder.mkdir()
    (folder / "cpuset.mems").write_text(mems)
    (folder / "cpuset.cpus").write_text(cpus)


def _remove(root: Path) -> None:
    for folder, dirs, _ in sorted(os.walk(root), key=lambda t: -t[0].count("/")):
        try:
            for pid in (Path(folder) / "cgroup.procs").read_text().split():
                (MOUNT / "cpuset" / "cgroup.procs").write_text(pid)
        except OSError:
            pass
        try:
            os.rmdir(folder)
        except OSError:
            pass


def test_a_cpuset_the_user_made_in_his_task_folder_cannot_keep_a_borrowed_core():
    assert os.geteuid() == 0, "this test makes cgroups and drops to a user: run it as root " \
        "(CI does)"
    assert _cgroup_v1_cpuset(), "this test needs the host's cgroup v1 cpuset hierarchy " \
        "with 2 CPUs (the project's machines have it)"
    node = f"evict{os.getpid()}"
    layout = SlurmCgroupLayout.named(node, CgroupVersion.V1, multiple_slurmd=True, mount=MOUNT)
    mems = (MOUNT / "cpuset" / "cpuset.mems").read_text().strip()
    root = layout.node_dir()
    user = None
    try:
        _make(root, "0-1", mems)
        _make(root / f"uid_{USER}", "0-1", mems)
        job = layout.job_dir(USER, JOB)
        _make(job, "0", mems)
        _make(job / "step_0", "0", mems)
        act = CpusetActuator(layout)
        act.apply(USER, JOB, S({0, 1}), allocation=S({0}))          # grown, sealed
        assert read_cpus(job / "step_0") == {0, 1}
        # slurmstepd makes the task folder now, and gives it to the job's user (22.05).
        _make(job / "step_0" / "task_0", "0-1", mems)
        os.chown(job / "step_0" / "task_0", USER, USER)
        task = job / "step_0" / "task_0"
        script = (f"mkdir {task}/mine && echo {mems} > {task}/mine/cpuset.mems && "
                  f"echo 0-1 > {task}/mine/cpuset.cpus && echo $$ > {task}/mine/cgroup.procs "
                  f"&& exec 3> {task}/mine/cpuset.cpus && echo ready && "
                  "while :; do echo 0-1 >&3 2>/dev/null; sleep 0.005; done")
        user = subprocess.Popen(["setpriv", f"--reuid={USER}", f"--regid={USER}",
                                 "--clear-groups", "sh", "-c", script],
                                stdout=subprocess.PIPE, text=True)
        assert user.stdout.readline().strip() == "ready"
        assert read_cpus(task / "mine") == {0, 1} and os.stat(task / "mine").st_uid == USER
        t0 = time.monotonic()
        act.apply(USER, JOB, S({0}), allocation=S({0}))             # the core taken back
        took = time.monotonic() - t0
        assert read_cpus(job) == {0} and read_cpus(job / "step_0" / "task_0") == {0}
        assert not (task / "mine").exists()
        assert str(user.pid) in (task / "cgroup.procs").read_text().split()
        assert os.sched_getaffinity(user.pid) == {0}
        time.sleep(0.2)                         # his loop goes on writing: nothing comes back
        assert read_cpus(job) == {0} and user.poll() is None
        print(f"\ncore taken back from the user's folder in {took * 1000:.1f} ms")
    finally:
        if user is not None:
            user.kill()
            user.wait()
        _remove(root)
    assert not root.exists()
