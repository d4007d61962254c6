"""Slurm 26.05's cgroup/v2 job folders named by SLUID (without CgroupJobIdPaths=yes): which job
such a folder is, as the slurmstepd in it says, on a fake cgroup tree and a fake /proc (the
shapes of tests/fixtures/slurm-26.05-cgroup-v2: job 15's SLUID is s1M9M8M9BHWA00)."""
import dataclasses
import os
from pathlib import Path

import pytest

from slurm_plugin.cgroups import (SLUID_RE, CgroupVersion, JobFolderNames, SlurmCgroupLayout,
                                  stepd_job_in, stepd_title)
from slurm_plugin.node.cgroup_actuator import CpusetActuator

SLUID = "s1M9M8M9BHWA00"        # job 15 in the fixtures' jobs.txt
OTHER = "s1M9M8M9BHHT00"        # job 14 there


class Node:
    """A v2 node folder (multiple-slurmd, as Debian builds) under ``tmp/cg`` and a /proc under
    ``tmp/proc``, whose processes are files as the kernel shows them."""

    def __init__(self, tmp: Path):
        self.proc = tmp / "proc"
        self.proc.mkdir()
        base = SlurmCgroupLayout.named("vm1", CgroupVersion.V2, multiple_slurmd=True,
                                       mount=tmp / "cg")
        self.layout = dataclasses.replace(base, names=JobFolderNames(
            lambda lay, name: stepd_job_in(lay, name, proc=self.proc)))
        self.layout.node_dir().mkdir(parents=True)
        (self.layout.node_dir() / "cpuset.cpus").write_text("0-3")

    def job_folder(self, name: str, cpus: str, steps=("step_batch",)) -> Path:
        top = self.layout.node_dir() / name
        for step in steps:
            for rel in (f"{step}/slurm", f"{step}/user/task_0"):
                (top / rel).mkdir(parents=True, exist_ok=True)
        (top / "cpuset.cpus").write_text(cpus)
        return top

    def process(self, pid: int, folder: Path, title: bytes, uids: str = "0\t0\t0\t0",
                cgroup: str | None = None, listed: bool = True) -> None:
        d = self.proc / str(pid)
        d.mkdir()
        (d / "comm").write_bytes(b"slurmstepd\n")
        (d / "status").write_bytes(b"Name:\tslurmstepd\nUid:\t" + uids.encode() + b"\n")
        (d / "cmdline").write_bytes(title + b"\0")
        rel = cgroup if cgroup is not None else \
            "/" + str(folder.relative_to(self.layout.hierarchy))
        (d / "cgroup").write_text(f"0::{rel}\n")
        if listed:
            with open(folder / "cgroup.procs", "a") as f:
                f.write(f"{pid}\n")


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


def test_the_sluid_form_is_slurms():
    """print_sluid: "s", then 13 of Crockford's base 32 (no I, L, O, U), the first holding the
    cluster id's top 4 bits (0-F). Matched whole: a newline after it is another name."""
    for good in (SLUID, OTHER, "sEKNKTV3WPV500", "s0000000000000"):
        assert SLUID_RE.fullmatch(good), good
    for bad in ("job_15", "S1M9M8M9BHWA00", "s1M9M8M9BHWA0", "s1M9M8M9BHWA000", "s1M9M8M9BHWU00",
                "sG000000000000", SLUID + "\n", "step_0", ""):
        assert not SLUID_RE.fullmatch(bad), bad


def test_stepd_titles():
    assert stepd_title(b"slurmstepd: [15.batch]\0") == (15, "step_batch")
    assert stepd_title(b"slurmstepd: [15.0]") == (15, "step_0")
    assert stepd_title(b"slurmstepd: [15.extern]") == (15, "step_extern")
    for bad in (b"slurmstepd: [15]", b"slurmstepd: [15.x]", b"slurmstepd: [15.0/..]",
                b"bash: [15.0]", b""):
        assert stepd_title(bad) is None, bad


def test_a_sluid_folder_is_the_job_its_slurmstepd_says(node):
    top = node.job_folder(SLUID, "1", steps=("step_batch", "step_0"))
    node.process(40, top / "step_batch" / "slurm", b"slurmstepd: [15.batch]")
    lay = node.layout
    assert lay.job_id_of(SLUID) == 15
    assert lay.job_dir(1000, 15) == top                     # the owner is not in a v2 path
    path = f"{lay.root}/{SLUID}/step_0/user/task_0"         # as /proc/<pid>/cgroup names it
    assert lay.job_of(path) == 15 and lay.step_of(path, 15) == "step_0"
    assert lay.step_of(path, 14) is None
    # A job with no folder: job_<J>, which is not there (callers see no folder).
    assert lay.job_dir(0, 14) == lay.node_dir() / "job_14"
    # job_<J> and SLUID folders side by side (a node upgraded with jobs running): each its own.
    (lay.node_dir() / "job_9").mkdir()
    assert lay.job_dir(0, 9).name == "job_9" and lay.job_id_of("job_9") == 9


def test_what_a_user_can_make_or_forge_tells_nothing(node):
    """A title is a process's own to set and a pid may be another process's a moment later:
    only a process of root's (every uid), in the step's own slurm folder by the kernel's
    word, titled for that same step, tells; and only from a slurm folder of root's."""
    lay = node.layout
    top = node.job_folder(SLUID, "1", steps=("step_batch", "step_0"))
    home = top / "step_batch" / "slurm"
    node.process(41, home, b"slurmstepd: [15.batch]", uids="1000\t1000\t1000\t1000")
    node.process(42, home, b"slurmstepd: [15.batch]", uids="1000\t0\t0\t0")      # set-uid
    node.process(43, home, b"slurmstepd: [15.batch]",                              # pid reused
                 cgroup=f"{lay.root}/{OTHER}/step_batch/slurm")
    node.process(44, home, b"slurmstepd: [15.0]")                                  # other step
    node.process(45, home, b"bash [15.batch]")
    (node.proc / "45" / "comm").write_bytes(b"bash\n")
    assert lay.job_id_of(SLUID) is None
    # A slurm folder not root's is not read at all, whatever it lists.
    other = top / "step_0" / "slurm"
    node.process(46, other, b"slurmstepd: [15.0]")
    os.chown(other, 1000, 1000)
    assert lay.job_id_of(SLUID) is None
    os.chown(other, 0, 0)
    assert lay.job_id_of(SLUID) == 15


def test_a_sluid_told_is_kept_until_its_folder_goes(node):
    """A SLUID is one job's for its folder's life (a requeued job gets a new one): told once,
    not asked again; forgotten once the node folder no longer lists it."""
    lay = node.layout
    top = node.job_folder(SLUID, "1")
    node.process(40, top / "step_batch" / "slurm", b"slurmstepd: [15.batch]")
    assert lay.job_id_of(SLUID) == 15
    (node.proc / "40" / "cmdline").write_bytes(b"slurmstepd: [16.batch]\0")
    assert lay.job_id_of(SLUID) == 15            # not asked again
    lay.names.keep([OTHER])                       # the node folder lists it no longer
    assert lay.job_id_of(SLUID) == 16            # asked again


def test_the_scan_keeps_an_untold_sluid_folder_apart(node):
    """The actuator's scan: a SLUID folder whose job is told is that job; one no slurmstepd
    tells yet (just made) is left in ``unidentified`` with its CPUs, never taken for a job."""
    told = node.job_folder(SLUID, "1")
    node.process(40, told / "step_batch" / "slurm", b"slurmstepd: [15.batch]")
    node.job_folder(OTHER, "2")                  # its slurmstepd has not joined it yet
    (node.layout.node_dir() / "system").mkdir()  # slurmd's own: no job
    act = CpusetActuator(node.layout)
    found = act.scan()
    assert set(found) == {15} and found[15].cpus == {1} and found[15].uid is None
    assert act.unidentified == {OTHER: frozenset({2})}
    node.process(41, node.layout.node_dir() / OTHER / "step_batch" / "slurm",
                 b"slurmstepd: [14.batch]")
    assert set(act.scan()) == {14, 15} and act.unidentified == {}


def test_the_start_checks_count_an_untold_folders_cores_as_some_jobs(node, tmp_path):
    """The Prolog's and a step start's checks on the real tree: a core in a folder no
    slurmstepd tells yet and in a job's folder is in two folders; a starting job's allocation
    that such a folder holds is not free."""
    from slurm_plugin.node.config import AgentConfig
    from slurm_plugin.node.ledger import Allocation, LedgerFile
    from slurm_plugin.node.safety import lent_cores, step_start_problems
    config = AgentConfig(node="vm1", state_dir=tmp_path / "state", run_dir=tmp_path / "run")
    config.state_dir.mkdir()
    told = node.job_folder(SLUID, "1")
    node.process(40, told / "step_batch" / "slurm", b"slurmstepd: [15.batch]")
    untold = node.job_folder(OTHER, "2")
    ledger_file = LedgerFile(config.state_dir, config.node)
    ledger = ledger_file.load()
    ledger.allocations[15] = Allocation(0, frozenset({1}))
    ledger.allocations[16] = Allocation(0, frozenset({2, 3}))
    ledger_file.save(ledger)
    act = CpusetActuator(node.layout)
    assert lent_cores(config, act) == []
    assert step_start_problems(config, 15, act) == []
    assert step_start_problems(config, 16, act) == [
        f"folder {OTHER} (no slurmstepd says whose) holds [2] of job 16's allocation"]
    (untold / "cpuset.cpus").write_text("1-2")
    assert lent_cores(config, act) == [f"core 1 in job 15 and folder {OTHER}"]
