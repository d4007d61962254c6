"""The cpuset actuator on a fake cgroup tree whose writes enforce cgroup v1's rule."""
from pathlib import Path

import pytest

from slurm_plugin.cgroups import CgroupVersion, SlurmCgroupLayout
from slurm_plugin.node import cgroup_actuator
from slurm_plugin.node.cgroup_actuator import (ActuatorError, CpusetActuator,
                                                      read_cpus)
from malleable_protocol.cpulist import format_cpu_list, parse_cpu_list


def make_tree(root: Path, layout: SlurmCgroupLayout, job_cpus: str, steps: dict[str, str]) -> Path:
    job = layout.job_dir(0, 7)
    job.mkdir(parents=True)
    for d in (layout.node_dir(), job.parent, job):
        (d / "cpuset.cpus").write_text("0-7" if d != job else job_cpus)
    for name, cpus in steps.items():
        (job / name).mkdir()
        (job / name / "cpuset.cpus").write_text(cpus)
    return job


class KernelV1:
    """Refuses a write that would leave a parent without a child's CPUs, or a child with CPUs
    its parent lacks, as cgroup v1 does (EBUSY / EINVAL)."""

    def __init__(self):
        self.writes = []

    def __call__(self, folder, cpus: frozenset[int]) -> None:
        folder = Path(folder)
        for child in (p for p in folder.iterdir() if p.is_dir()):
            if not read_cpus(child) <= cpus:
                raise ActuatorError(f"EBUSY: {folder} would drop CPUs of {child.name}")
        parent = read_cpus(folder.parent)
        if parent is not None and not cpus <= parent:
            raise ActuatorError(f"EINVAL: {folder} outside its parent")
        (folder / "cpuset.cpus").write_text(format_cpu_list(cpus))
        self.writes.append((folder.name, format_cpu_list(cpus)))


@pytest.fixture
def v1(tmp_path, monkeypatch):
    kernel = KernelV1()
    monkeypatch.setattr(CpusetActuator, "_write", staticmethod(kernel))
    layout = SlurmCgroupLayout.named("n1", CgroupVersion.V1, multiple_slurmd=True, mount=tmp_path)
    return layout, kernel


@pytest.mark.parametrize("start,target", [("0", "0-3"), ("0-3", "0"), ("0-1", "2-3"), ("1", "0-7")])
def test_moves_in_an_order_v1_accepts(v1, start, target):
    layout, kernel = v1
    job = make_tree(layout.hierarchy, layout, start, {"step_0": start, "step_batch": start})
    CpusetActuator(layout).apply(0, 7, parse_cpu_list(target))
    assert read_cpus(job) == parse_cpu_list(target)
    # Every step follows, the batch step too (the SPANK plugin lets new steps start).
    assert read_cpus(job / "step_0") == parse_cpu_list(target)
    assert read_cpus(job / "step_batch") == parse_cpu_list(target)


@pytest.mark.parametrize("start", ["0-1", "0-7"])
def test_concurrent_steps_get_their_own_blocks(v1, start):
    layout, kernel = v1
    job = make_tree(layout.hierarchy, layout, start, {"step_batch": start, "step_0": start,
                                                  "step_1": start, "step_1/task_0": start})
    split = {"step_0": frozenset({0, 1, 2}), "step_1": frozenset({3, 4, 5})}
    CpusetActuator(layout).apply(0, 7, parse_cpu_list("0-5"), split)
    assert read_cpus(job) == parse_cpu_list("0-5")
    assert read_cpus(job / "step_batch") == parse_cpu_list("0-5")    # no ranks: all of them
    assert read_cpus(job / "step_0") == {0, 1, 2}
    assert read_cpus(job / "step_1") == read_cpus(job / "step_1" / "task_0") == {3, 4, 5}


def test_repairs_a_step_slurm_reset(v1):
    layout, kernel = v1
    job = make_tree(layout.hierarchy, layout, "0-3", {"step_0": "0-3", "step_1": "0"})
    CpusetActuator(layout).apply(0, 7, parse_cpu_list("0-3"))
    assert read_cpus(job / "step_1") == {0, 1, 2, 3}


def test_refuses_empty_and_missing_and_hostile(v1, tmp_path):
    layout, _ = v1
    act = CpusetActuator(layout)
    with pytest.raises(ActuatorError):
        act.apply(0, 7, frozenset({0}))          # no folder yet
    make_tree(layout.hierarchy, layout, "0", {})
    with pytest.raises(ValueError):
        act.apply(0, 7, frozenset())
    for bad in ("7/../../x", -1, True, 2**40):
        with pytest.raises(ValueError):
            act.apply(0, bad, frozenset({0}))
    with pytest.raises(ValueError):
        SlurmCgroupLayout.named("../etc", CgroupVersion.V1, multiple_slurmd=True)


def test_v2_layout_same_code_path(tmp_path):
    layout = SlurmCgroupLayout.named("n1", CgroupVersion.V2, multiple_slurmd=True, mount=tmp_path)
    assert layout.job_dir(0, 7) == tmp_path / "system.slice" / "n1_slurmstepd.scope" / "job_7"
    job = make_tree(tmp_path, layout, "0", {"step_0": "0"})
    CpusetActuator(layout).apply(0, 7, frozenset({0, 1}))
    assert read_cpus(job) == {0, 1} and read_cpus(job / "step_0") == {0, 1}


def test_the_walk_below_a_job_is_bounded(v1):
    """Folders a job user makes below a step (v1 gives steps to the user) are never walked:
    they are reported as foreign (the first few); Slurm-named ones are walked only to Slurm's
    depth and count, so a deep or wide tree costs a bounded cycle."""
    layout, kernel = v1
    job = make_tree(layout.hierarchy, layout, "0", {"step_0": "0"})
    deep = job / "step_0"
    for i in range(40):
        deep = deep / "d"
        deep.mkdir()
        (deep / "cpuset.cpus").write_text("0")
    for i in range(cgroup_actuator.MAX_FOLDERS + 50):
        (job / "step_0" / f"task_{i}").mkdir()
    scanned = CpusetActuator(layout).scan()[7]
    assert len(scanned.folders) == cgroup_actuator.MAX_FOLDERS
    assert max(rel.count("/") for rel in scanned.folders) + 1 <= cgroup_actuator.MAX_DEPTH
    assert "step_0/d" in scanned.foreign and \
        len(scanned.foreign) == cgroup_actuator.MAX_FOREIGN_NAMED


def test_borrowed_cores_only_to_a_sealed_job_without_foreign_folders(v1):
    """v1's step and task folders belong to the job's user, who could make a cpuset in them
    holding a borrowed core: the reclaim's write would then fail (EBUSY). A grow beyond the
    allocation first gives Slurm's folders to root; a job with a folder Slurm did not make is
    not grown beyond its allocation (nothing written), and may still shrink within it."""
    import os
    layout, kernel = v1
    job = make_tree(layout.hierarchy, layout, "0-1", {"step_0": "0-1"})
    (job / "step_0" / "task_0").mkdir()
    (job / "step_0" / "task_0" / "cpuset.cpus").write_text("0-1")
    for d in (job / "step_0", job / "step_0" / "task_0"):
        os.chown(d, 4242, 4242)
    act = CpusetActuator(layout)
    act.apply(0, 7, frozenset({0, 1}), allocation=frozenset({0, 1}))     # within: not sealed
    assert (job / "step_0").stat().st_uid == 4242
    act.apply(0, 7, frozenset({0, 1, 2}), allocation=frozenset({0, 1}))
    assert (job / "step_0").stat().st_uid == 0 and (job / "step_0" / "task_0").stat().st_uid == 0
    assert read_cpus(job / "step_0" / "task_0") == {0, 1, 2}
    assert not act.scan()[7].unsealed
    (job / "step_0" / "task_1").mkdir()      # slurmstepd's next task folder: the user's again
    (job / "step_0" / "task_1" / "cpuset.cpus").write_text("0-2")
    os.chown(job / "step_0" / "task_1", 4242, 4242)
    assert act.scan()[7].unsealed
    act.seal_job(0, 7)                        # the executor does it in the same cycle
    assert not act.scan()[7].unsealed and (job / "step_0" / "task_1").stat().st_uid == 0
    (job / "step_0" / "task_1" / "cpuset.cpus").write_text("0-1")
    (job / "step_0" / "task_0" / "mine").mkdir()        # made before the seal (a race)
    (job / "step_0" / "task_0" / "mine" / "cpuset.cpus").write_text("0")
    writes = len(kernel.writes)
    with pytest.raises(ActuatorError, match="did not make.*step_0/task_0/mine"):
        act.apply(0, 7, frozenset({0, 1, 2, 3}), allocation=frozenset({0, 1}))
    assert len(kernel.writes) == writes
    act.apply(0, 7, frozenset({0}), allocation=frozenset({0, 1}))
    assert read_cpus(job) == {0} and read_cpus(job / "step_0" / "task_0") == {0}


def test_a_folder_named_as_slurm_names_but_made_by_the_user_is_foreign(v1):
    """A user's task_4242 in his own v1 step folder: its name is Slurm's, but the kernel gave
    its files to the user, who could re-widen it while the agent narrows (EBUSY). It is not
    walked, not written, and the job is not grown beyond its allocation; Slurm's own task
    folder (a root-made one, given to the user as 22.05 does) still is Slurm's."""
    import os
    layout, kernel = v1
    job = make_tree(layout.hierarchy, layout, "0-1", {"step_0": "0-1"})
    for task, owner in (("task_0", 0), ("task_4242", 4242)):
        d = job / "step_0" / task
        d.mkdir()
        (d / "cpuset.cpus").write_text("0-1")
        (d / "cgroup.procs").write_text("")
        os.chown(d, 4242, 4242)
        for f in ("cpuset.cpus", "cgroup.procs") if owner else ():
            os.chown(d / f, owner, owner)
    act = CpusetActuator(layout)
    scanned = act.scan()[7]
    assert scanned.foreign == ("step_0/task_4242",)
    assert set(scanned.folders) == {"step_0", "step_0/task_0"}
    with pytest.raises(ActuatorError, match="did not make.*task_4242"):
        act.apply(0, 7, frozenset({0, 1, 2}), allocation=frozenset({0, 1}))
    assert read_cpus(job) == {0, 1}


@pytest.mark.parametrize("release", ["24.11", "26.05", "26.05-sluid"])
def test_v2_tree_as_slurm_makes_it(tmp_path, release):
    """The shape captured on Debian's Slurm 24.11 (trixie) and 26.05 (sid) under systemd
    (fixtures slurm-<release>-cgroup-v2): root's folders, Slurm's CPUs on job_<J> and
    step_<S>/user, the slurmstepd in step_<S>/slurm, tasks in step_<S>/user/task_<T> (and, on
    26.05, an empty task_special), the others empty (inherit). Every level below the job takes
    the job's CPUs; the owner is not in the path. 26.05-sluid: the same tree with the job
    folder named by the job's SLUID (from the fixture's jobs.txt), as 26.05 names it without
    CgroupJobIdPaths=yes; which job it is, the slurmstepd in it says (here: the fixture)."""
    import dataclasses
    from slurm_plugin.cgroups import JobFolderNames
    layout = SlurmCgroupLayout.named("vm1", CgroupVersion.V2, multiple_slurmd=True, mount=tmp_path)
    fixture = (Path(__file__).parents[2] / "fixtures" /
               f"slurm-{release.split('-')[0]}-cgroup-v2" / "find_dirs.txt")
    scope = "/sys/fs/cgroup/system.slice/vm1_slurmstepd.scope/"
    lines = [x[len(scope):] for x in fixture.read_text().splitlines() if x.startswith(scope)]
    job_name = next(x.split("/")[0] for x in lines if x.endswith("/step_0"))   # the one with a step
    j = int(job_name[4:])
    folder = job_name
    if release.endswith("sluid"):
        jobs = (fixture.parent / "jobs.txt").read_text()
        folder = jobs.split(f"JobId={j} ", 1)[1].split("SLUID=", 1)[1].split()[0]
        layout = dataclasses.replace(layout, names=JobFolderNames(
            lambda lay, name: j if name == folder else None))
    for rel in (x for x in lines if x.split("/")[0] == job_name):
        d = layout.node_dir() / rel.replace(job_name, folder, 1)
        d.mkdir(parents=True)
        (d / "cpuset.cpus").write_text("1" if d.name in (folder, "user") else "")
    (layout.node_dir() / "cpuset.cpus").write_text("")
    found = CpusetActuator(layout).scan()[j]
    assert found.uid is None and found.cpus == {1}
    special = {"step_batch/user/task_special", "step_0/user/task_special"} \
        if release.startswith("26.05") else set()
    assert set(found.folders) == {"step_batch", "step_batch/slurm", "step_batch/user",
                                  "step_batch/user/task_0", "step_0", "step_0/slurm",
                                  "step_0/user", "step_0/user/task_0"} | special
    CpusetActuator(layout).apply(1000, j, frozenset({0, 1}))
    job = layout.job_dir(1000, j)
    assert job.name == folder
    assert all(read_cpus(job / rel) == {0, 1} for rel in found.folders)
    CpusetActuator(layout).apply(1000, j, frozenset({1}))
    assert read_cpus(job) == {1} and read_cpus(job / "step_0" / "user" / "task_0") == {1}


def test_a_grow_widens_threads_bound_to_the_jobs_former_cores(tmp_path):
    """Real processes listed in a (fake) step folder: the one bound to exactly the job's former
    CPUs (as slurmstepd leaves its tasks on cgroup v2) gets the new ones; one its user bound to
    another core keeps its own mask. A shrink leaves masks to the kernel."""
    import os
    import subprocess
    layout = SlurmCgroupLayout.named("n1", CgroupVersion.V2, multiple_slurmd=True, mount=tmp_path)
    job = make_tree(tmp_path, layout, "0", {"step_0": "0", "step_0/user": "0"})
    procs = [subprocess.Popen(["sleep", "30"], preexec_fn=lambda m=m: os.sched_setaffinity(0, m))
             for m in ({0}, {1})]
    try:
        (job / "step_0" / "user" / "cgroup.procs").write_text(f"{procs[0].pid}\n{procs[1].pid}\n")
        CpusetActuator(layout).apply(0, 7, frozenset({0, 1}))
        assert os.sched_getaffinity(procs[0].pid) == {0, 1}
        assert os.sched_getaffinity(procs[1].pid) == {1}
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_users_deep_tree_below_a_job_folder_is_removed_without_recursion(tmp_path):
    """What a job user leaves in his v1 step folder (Slurm cannot remove the job folder then,
    and it would hold its cores): removed bottom-up, iteratively, whatever its depth."""
    import os
    from slurm_plugin.cgroups import remove_cgroup_tree
    job = tmp_path / "job_7"
    (job / "step_batch").mkdir(parents=True)
    os.chdir(job / "step_batch")
    try:
        for _ in range(1500):
            os.mkdir("x")
            os.chdir("x")
    finally:
        os.chdir(tmp_path)
    (job / "link").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").mkdir()
    report = remove_cgroup_tree(job, timeout_s=0.1, sleep=lambda s: None)
    # The link is never followed; a folder holding it (never on cgroupfs) is not removed.
    assert len(report.removed) == 1501 and [f for f, _ in report.failed] == [job]
    assert (tmp_path / "outside").is_dir() and not (job / "step_batch").exists()


def test_widening_masks_looks_at_a_bounded_number_of_threads(tmp_path):
    """A job's user chooses how many processes and threads its folders hold: a grow looks at
    MAX_WIDEN_THREADS of them at most, however many are listed (here one process of 64
    threads listed 4096 times in each of three folders: 786,432 without the bound)."""
    import os
    import subprocess
    import sys
    import time
    from slurm_plugin.node import cgroup_actuator as ca
    layout = SlurmCgroupLayout.named("n1", CgroupVersion.V2, multiple_slurmd=True, mount=tmp_path)
    job = make_tree(tmp_path, layout, "0", {"step_0": "0", "step_0/user": "0"})
    child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                              "for _ in range(63): threading.Thread(target=time.sleep, "
                              "args=(60,), daemon=True).start()\nprint(flush=True)\n"
                              "time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()
        assert len(os.listdir(f"/proc/{child.pid}/task")) == 64
        folders = [str(job), str(job / "step_0"), str(job / "step_0" / "user")]
        for folder in folders:
            (Path(folder) / "cgroup.procs").write_text(f"{child.pid}\n" * 4096)
        actuator = CpusetActuator(layout)
        actuator._set_affinity = lambda tid, cpus: None
        t0 = time.process_time()
        seen = actuator._widen_masks(folders, frozenset({0}), {f: frozenset({0, 1})
                                                               for f in folders})
        spent = time.process_time() - t0
        assert seen == ca.MAX_WIDEN_THREADS
        print(f"{seen} threads looked at in {spent * 1000:.1f} ms of CPU")
    finally:
        child.kill()
        child.wait()
