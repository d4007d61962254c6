"""The step start's fast path: files in root's state folder that the SPANK plugin reads in C,
so that a step of a job holding exactly its allocation starts with no process started.

Every cycle (under the node's lock) leaves:

- ``gate-<node>/<job>``: an empty file for each job that holds exactly its Slurm allocation,
  none of whose cores another job holds (``gated_jobs``). slurmstepd may write that job's folder
  back to its allocation at once: the plugin, holding the same lock, only writes a fence file.
  A job without one (grown, lending, faulted, not known yet) goes the slow way: the agent's
  socket (``step_socket``), else the Python step-start hook.
- the plugin's fences, ``fences-<node>/<job>.<step>`` ("<slurmstepd pid> <wall time>"), taken
  into the ledger by the next cycle (``read_fences``; removed once the ledger is saved): until
  that step's slurmstepd has joined its cpuset, no cycle grows or lends the job.

A cycle removes the gate of every job it is about to act on before it acts (``close``), and
publishes the gates after: an agent killed mid-cycle leaves no gate on a job it changed.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from malleable_protocol import check_job_id, check_node_name
from malleable_protocol.layout import check_step_name
from malleable_protocol.safe_io import ensure_private_dir, list_bounded, open_dir, read_bounded

from malleable_policy.model import Outcome, OutcomeStatus
from slurm_plugin.node.ledger import Fence
from malleable_policy.model import NodeSnapshot

MAX_FENCE_FILES = 4096      # steps starting at once on one node, far above any real count
_FENCE_NAME = re.compile(r"^([0-9]{1,10})\.(step_[0-9a-z_]{1,16})$")


def gated_jobs(snapshot: NodeSnapshot, outcomes: Iterable[Outcome]) -> set[int]:
    """The jobs a step may start in without a cycle, after ``outcomes``: each holds exactly its
    allocation, no other job holds any of those cores, and nothing about it is in doubt (a
    fault, an action that failed, folders out of line). A job whose Prolog ran but whose cores
    are not known yet (``pending_starts``) is gated when no job holds a core outside its own
    allocation: Slurm gave the new job cores nobody else was given. Pure."""
    done = {o.action.job_id: o for o in outcomes}
    held: dict[int, frozenset[int]] = {}
    doubtful: set[int] = set()
    for job in snapshot.jobs:
        outcome = done.get(job.job_id)
        if outcome is None:
            held[job.job_id] = job.current
        elif outcome.status is OutcomeStatus.APPLIED:
            held[job.job_id] = outcome.action.after
        else:       # half done, or not: it may hold either
            held[job.job_id] = job.current | outcome.action.after
            doubtful.add(job.job_id)
    gated = set()
    for job in snapshot.jobs:
        others = frozenset().union(*(c for j, c in held.items() if j != job.job_id))
        if job.job_id in doubtful or job.fault is not None or not job.folders_in_line:
            continue
        if held[job.job_id] == job.allocation and not others & job.allocation:
            gated.add(job.job_id)
    if all(held[j.job_id] <= j.allocation for j in snapshot.jobs) and not doubtful:
        gated |= set(snapshot.pending_starts)
    return gated


@dataclass(frozen=True)
class StepGate:
    """The gate and fence folders of one node in root's state folder (0700, like it)."""

    state_dir: Path
    node: str

    @property
    def gates(self) -> Path:
        return self.state_dir / f"gate-{check_node_name(self.node)}"

    @property
    def fences(self) -> Path:
        return self.state_dir / f"fences-{check_node_name(self.node)}"

    def prepare(self) -> None:
        for folder in (self.gates, self.fences):
            if ensure_private_dir(folder).stat().st_mode & 0o077:
                folder.chmod(0o700)

    def close(self, job_ids: Iterable[int]) -> None:
        """Before a cycle acts on these jobs: their steps go the slow way until it is done."""
        for job_id in job_ids:
            try:
                os.unlink(self.gates / str(check_job_id(job_id)))
            except FileNotFoundError:
                pass

    def publish(self, gated: set[int]) -> None:
        """Exactly ``gated`` have a gate file."""
        try:
            fd = open_dir(self.gates)
        except FileNotFoundError:       # the first cycle, or /run emptied
            self.prepare()
            fd = open_dir(self.gates)
        try:
            present = set()
            for name in list_bounded(fd, MAX_FENCE_FILES * 4):
                if name.isascii() and name.isdigit() and int(name) in gated:
                    present.add(int(name))
                else:
                    os.unlink(name, dir_fd=fd)
            for job_id in gated - present:
                os.close(os.open(str(check_job_id(job_id)),
                                 os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                                 dir_fd=fd))
        finally:
            os.close(fd)

    def read_fences(self) -> tuple[list[str], dict[tuple[int, str], Fence]]:
        """The fence files the plugin wrote since the last cycle: every file's name (for
        ``remove_fences``, once the ledger that holds them is saved) and the fences of those
        that parse, by (job, step). One that does not parse is only removed: only root writes
        here, and it fences nothing the slow path would not."""
        try:
            fd = open_dir(self.fences)
        except FileNotFoundError:
            return [], {}
        fences: dict[tuple[int, str], Fence] = {}
        try:
            names = list_bounded(fd, MAX_FENCE_FILES)
            for name in names:
                try:
                    key, fence = self._parse(name, read_bounded(name, 64, dir_fd=fd))
                    fences[key] = fence
                except (OSError, ValueError):
                    pass
        finally:
            os.close(fd)
        return names, fences

    def remove_fences(self, names: Iterable[str]) -> None:
        for name in names:
            try:
                os.unlink(self.fences / name)
            except FileNotFoundError:
                pass

    @staticmethod
    def _parse(name: str, raw: bytes) -> tuple[tuple[int, str], Fence]:
        """"<job>.<step>" holding "<pid> <since>" -> ((job, step), Fence). Raises ValueError."""
        m = _FENCE_NAME.fullmatch(name)
        if m is None:
            raise ValueError(f"not a fence file: {name!r:.40}")
        job_id, step = check_job_id(int(m.group(1))), check_step_name(m.group(2))
        fields = raw.decode("ascii").split()
        if len(fields) != 2 or not fields[0].isdigit():
            raise ValueError(f"bad fence {raw!r:.40}")
        since = float(fields[1])
        if not 0 < since < 1e11:
            raise ValueError(f"bad fence time {since}")
        return (job_id, step), Fence(step=step, stepd_pid=int(fields[0]), since=since)
