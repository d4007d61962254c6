"""Reads the status records of a job's ranks. They are untrusted input: the job's folder and
each record are opened without following links or blocking, must be owned by the job's user,
are bounded in size and depth, and a record is believed only for a live process of that user in
the job's cgroup on this node."""
from __future__ import annotations

import os
import time
from typing import Callable

from malleable_protocol import ProtocolError, RankStatus, RunLayout
from malleable_protocol.records import MAX_RANK_RECORDS, MAX_RECORD_BYTES
from malleable_protocol.safe_io import list_bounded, open_dir, read_bounded

from slurm_plugin.cgroups import SlurmCgroupLayout, process_cpuset
from malleable_policy.model import RankView
from slurm_plugin.node.jobfs import MountReader, mounted_over, node_mounts
from slurm_plugin.node.procs import process_uid

MAX_RANK_FILES = MAX_RANK_RECORDS


def job_step_of(pid: int, job_id: int, cgroups: SlurmCgroupLayout, uid: int) -> str | None:
    """The step folder (``step_0``, ``step_batch``...) of ``job_id`` on this node whose cpuset
    binds ``pid``, when it is a process of ``uid`` (several slurmd may share one machine, and so
    one /proc); else None. The kernel says, not the process."""
    path = process_cpuset(pid)
    step = cgroups.step_of(path, job_id) if path else None
    if step is None or process_uid(pid) != uid:
        return None
    return step


def in_job_cgroup(pid: int, job_id: int, cgroups: SlurmCgroupLayout, uid: int) -> bool:
    return job_step_of(pid, job_id, cgroups, uid) is not None


PidCheck = Callable[[int, int, SlurmCgroupLayout, int], bool]
StepLookup = Callable[[int, int, SlurmCgroupLayout, int], "str | None"]


class InputBudgetExceeded(ProtocolError):
    """Reading one job's records cost root more than its budget this cycle."""


class FolderMountedOver(ProtocolError):
    """The job's records folder has a file system its user mounted (``jobfs``): not opened."""


Charge = Callable[[int], None]


def _read_records(layout: RunLayout, job_id: int, owner: int | None,
                  charge: Charge | None = None) -> list[RankStatus]:
    """The decodable records in the job's folder, opened without following links (the folder
    itself included); with ``owner``, only a folder and records of that uid. ``charge(n)`` is
    told each record's size before it is decoded, and 0 after, and may stop the read
    (InputBudgetExceeded)."""
    try:
        jobs_fd = open_dir(layout.jobs_dir)
    except OSError:
        return []
    try:
        dfd = open_dir(layout.job_dir(job_id).name, dir_fd=jobs_fd)
    except OSError:
        return []
    finally:
        os.close(jobs_fd)
    out = []
    try:
        if owner is not None and os.fstat(dfd).st_uid != owner:
            return out        # not the folder the Prolog made for this job's user
        names = [n for n in list_bounded(dfd, MAX_RANK_FILES)
                 if RunLayout.parse_status_name(n) is not None]
        for name in sorted(names):
            try:
                raw = read_bounded(name, MAX_RECORD_BYTES, dir_fd=dfd, owner=owner)
            except OSError:
                continue
            if charge is not None:
                charge(len(raw))
            try:
                out.append(RankStatus.decode(raw))
            except ProtocolError:
                continue
            finally:
                if charge is not None:
                    charge(0)        # after each decode too: its cost is the user's
    finally:
        os.close(dfd)
    return out


def read_job_ranks(layout: RunLayout, job_id: int, uid: int, cgroups: SlurmCgroupLayout, *,
                   step_of: StepLookup = job_step_of,
                   charge: Charge | None = None) -> tuple[RankView, ...]:
    """The records of ``job_id``'s ranks that run on the node of ``cgroups``, each with its
    step; bad ones are skipped."""
    out = []
    steps: dict[int, str | None] = {}      # each pid checked once, however many records name it
    for st in _read_records(layout, job_id, uid, charge):
        if charge is not None:
            charge(0)        # the pid checks below read /proc: they count too
        if st.pid not in steps:
            steps[st.pid] = step_of(st.pid, job_id, cgroups, uid)
        step = steps[st.pid]
        if step is not None:
            out.append(RankView(pid=st.pid, rank=st.rank, local_rank=st.local_rank,
                                local_size=st.local_size, intra_active=st.intra_active,
                                steps_per_s=dict(st.steps_per_s), steps=st.steps, step=step,
                                reload_signal=st.reload_signal))
    return tuple(out)


def read_job_statuses(layout: RunLayout, job_id: int, *,
                      mounts: MountReader = node_mounts) -> list[RankStatus]:
    """Every readable record of a job, for display (``malleable status``): no pid check; none
    from a folder its user mounted something on."""
    if layout.job_dir(job_id).name in mounted_over(layout.jobs_dir, mounts()):
        return []
    return _read_records(layout, job_id, None)


class RankReader:
    """``read_job_ranks`` with a budget per user per cycle: the bytes and the CPU time root may
    spend on the records of one user's jobs (he writes them), however many jobs he runs on the
    node. Over budget, the read stops with InputBudgetExceeded, which holds the job being read
    to its allocation this cycle (its fault; his later jobs too) and touches no other user's.
    Made once per node (``node.make_reconciler``) and shared by the observer and the executor,
    which re-reads records while a shrink waits; the reconciler calls ``begin_cycle``."""

    def __init__(self, *, max_bytes: int = 256 * 1024, max_cpu_s: float = 0.02,
                 cpu_clock: Callable[[], float] = time.thread_time,
                 step_of: StepLookup = job_step_of, mounts: MountReader = node_mounts):
        self.max_bytes = max_bytes
        self.max_cpu_s = max_cpu_s
        self._cpu_clock = cpu_clock
        self._step_of = step_of
        self._mounts = mounts
        self._spent: dict[int, tuple[int, float]] = {}     # uid -> (bytes, CPU seconds)
        self._mounted_over: dict[str, str] | None = None   # read once a cycle

    def begin_cycle(self) -> None:
        self._spent.clear()
        self._mounted_over = None

    def spent(self, uid: int) -> tuple[int, float]:
        """What the records of ``uid``'s jobs cost root this cycle."""
        return self._spent.get(uid, (0, 0.0))

    def charge_cpu(self, uid: int, seconds: float) -> None:
        """Count CPU root spent on ``uid``'s input elsewhere this cycle (walking the cgroup
        folders below his jobs, which his tasks and folders make) against the same budget:
        his records are read with what is left."""
        nbytes, cpu = self.spent(uid)
        self._spent[uid] = (nbytes, cpu + max(0.0, seconds))

    def __call__(self, layout: RunLayout, job_id: int, uid: int,
                 cgroups: SlurmCgroupLayout) -> tuple[RankView, ...]:
        if self._mounted_over is None:
            self._mounted_over = mounted_over(layout.jobs_dir, self._mounts())
        why = self._mounted_over.get(layout.job_dir(job_id).name)
        if why:
            raise FolderMountedOver(f"job {job_id}: {why}")
        nbytes, cpu = self.spent(uid)
        t0 = last = self._cpu_clock()
        dearest = 0.0      # the most one record has cost: the next may cost as much

        def charge(n: int) -> None:
            nonlocal nbytes, last, dearest
            nbytes += n
            now = self._cpu_clock()
            dearest, last = max(dearest, now - last), now
            used = cpu + now - t0
            if nbytes > self.max_bytes or used + dearest > self.max_cpu_s:
                # The same words every cycle: the event log records a fault when it changes.
                raise InputBudgetExceeded(
                    f"job {job_id}: its user's input (records, cgroup folders) cost more than "
                    f"its budget this cycle ({self.max_bytes // 1024} KiB, "
                    f"{self.max_cpu_s * 1000:.0f} ms of CPU, for all his jobs on the node)")

        charge(0)
        try:
            return read_job_ranks(layout, job_id, uid, cgroups, step_of=self._step_of,
                                  charge=charge)
        finally:
            self._spent[uid] = (nbytes, cpu + self._cpu_clock() - t0)
