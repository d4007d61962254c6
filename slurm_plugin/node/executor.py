"""Carries out a Plan: each action in an order that never gives a core to two jobs.

An action that takes cores waits for the actions that release them; if one of those failed
(or was cancelled), it is cancelled too, so a failed shrink never leaves two jobs on one core.
Before a job's cpuset narrows, its ranks are told (target file + the reload signal each rank's
record names: SIGUSR1, SIGUSR2 or a real-time signal, never another); the ranks of every
shrinking job are told first and awaited together, once, for at most ``shrink_wait_s``, so a
cycle's time stays bounded whatever the number of jobs, and threads drop no later than the
cores. Every outcome is returned, none is dropped.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from malleable_protocol import ProtocolError, RunLayout, Target, is_reload_signal, rank_share
from malleable_protocol.layout import ENTRY_DIR_MODE
from malleable_protocol.safe_io import ensure_private_dir, share_read_with, write_atomic

from slurm_plugin.node.cgroup_actuator import ActuatorError, CpusetActuator
from malleable_policy.model import (Action, ActionKind, NodeSnapshot, Outcome, OutcomeStatus,
                                    Plan, RankView)
from slurm_plugin.node.procs import signal_verified
from slurm_plugin.node.ranks import PidCheck, in_job_cgroup, read_job_ranks

log = logging.getLogger(__name__)

_ORDER = {ActionKind.SHRINK: 0, ActionKind.MOVE: 1, ActionKind.REALIGN: 2, ActionKind.GROW: 3}


def _announced(a: Action, job) -> bool:
    """Whether the action's ranks are told (target + signal) before any cpuset is written: a
    malleable job with ranks that is about to lose cores."""
    return bool(a.releases and job.ranks and job.malleable)


class PlanExecutor:
    def __init__(self, node: str, layout: RunLayout, actuator: CpusetActuator, *,
                 shrink_wait_s: float = 0.5, read_ranks: Callable = read_job_ranks,
                 check_pid: PidCheck = in_job_cgroup,
                 send_signal: Callable[[int, int, Callable[[int], bool]], bool] = signal_verified,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.node = node
        self._told_sharing: set[str] = set()     # fallbacks of _write_target already logged
        self.layout = layout
        self.actuator = actuator
        self.shrink_wait_s = shrink_wait_s
        self._read_ranks = read_ranks
        self._check_pid = check_pid
        self._send_signal = send_signal
        self._clock = clock
        self._sleep = sleep

    def execute(self, plan: Plan, snapshot: NodeSnapshot) -> list[Outcome]:
        pending = sorted(plan.actions, key=lambda a: (_ORDER[a.kind], a.job_id))
        providers = {a.job_id: [b.job_id for b in plan.actions
                                if b is not a and b.releases & a.takes] for a in pending}
        done: dict[int, Outcome] = {}
        announced = self._announce_shrinks(plan, snapshot)
        while pending:
            progressed = False
            for a in list(pending):
                deps = [done.get(j) for j in providers[a.job_id]]
                if any(d is None for d in deps):
                    continue
                pending.remove(a)
                progressed = True
                blocked = [d.action.job_id for d in deps if d.status is not OutcomeStatus.APPLIED]
                if blocked:
                    done[a.job_id] = Outcome(a, OutcomeStatus.CANCELLED,
                                             f"needs cores job(s) {blocked} did not release")
                else:
                    done[a.job_id] = announced.get(a.job_id) or self._apply(a, snapshot)
            if not progressed:    # a cycle (jobs swapping cores): none of it is safe
                for a in pending:
                    done[a.job_id] = Outcome(a, OutcomeStatus.CANCELLED, "cyclic core exchange")
                break
        for job in snapshot.jobs:
            if job.unsealed and job.job_id not in done:     # a grow seals as it applies
                try:
                    self.actuator.seal_job(job.uid, job.job_id)
                except OSError:
                    pass       # a folder that went; the next cycle looks again
        return [done[a.job_id] for a in sorted(plan.actions,
                                                key=lambda a: (_ORDER[a.kind], a.job_id))]

    def _announce_shrinks(self, plan: Plan, snapshot: NodeSnapshot) -> dict[int, Outcome]:
        """Tell the ranks of every job about to lose cores, then wait (once, bounded) until
        they run no more threads than they will have cores. Returns the actions that failed
        here (their target could not be written): they are not applied."""
        failed: dict[int, Outcome] = {}
        told = []
        for a in plan.actions:
            if not _announced(a, snapshot.job(a.job_id)):
                continue
            job = snapshot.job(a.job_id)
            try:
                self._write_target(a)
            except (OSError, ValueError, ProtocolError) as exc:
                failed[a.job_id] = Outcome(a, OutcomeStatus.FAILED,
                                           f"target: {type(exc).__name__}: {exc}")
                continue
            self._signal(a, job.ranks)
            told.append(a)
        deadline = self._clock() + self.shrink_wait_s
        while told and self._clock() < deadline:
            told = [a for a in told if not self._parked(a)]
            if told:
                self._sleep(0.005)
        return failed

    def _parked(self, a: Action) -> bool:
        try:
            ranks = self._read_ranks(self.layout, a.job_id, a.uid, self.actuator.layout)
            return all(r.intra_active <= len(rank_share(a.step_cpus.get(r.step, a.after),
                                                        r.local_rank, r.local_size))
                       for r in ranks)
        except ValueError:     # a bad local rank, the job's read budget spent: not waited for
            return True

    def _apply(self, a: Action, snapshot: NodeSnapshot) -> Outcome:
        t0 = self._clock()
        job = snapshot.job(a.job_id)
        try:
            if a.kind is not ActionKind.REALIGN and job.malleable and not _announced(a, job):
                self._write_target(a)
            self.actuator.apply(a.uid, a.job_id, a.after, a.step_cpus, allocation=a.allocation)
            if job.ranks and a.kind is not ActionKind.REALIGN:
                self._signal(a, job.ranks)   # grown: use the new cores; shrunk: re-pin
        except (ActuatorError, OSError, ValueError, ProtocolError) as exc:
            return Outcome(a, OutcomeStatus.FAILED, f"{type(exc).__name__}: {exc}",
                           round((self._clock() - t0) * 1000, 3))
        return Outcome(a, OutcomeStatus.APPLIED, latency_ms=round((self._clock() - t0) * 1000, 3))

    def _write_target(self, a: Action) -> None:
        """The job's target on this node, readable by root and the job's user alone (its ranks
        read it as that user) and writable by root alone: root owns it (a user who owned it could
        chmod it), mode 0600, and a POSIX ACL entry gives the job's uid read access, not its
        group (a group such as "users" is shared by strangers). Where the filesystem has no
        ACLs: group = the user's primary group, 0640 (said once in the log); without a passwd
        entry either: root only (the ranks then follow their cgroup allowance alone)."""
        folder = ensure_private_dir(self.layout.targets_dir, ENTRY_DIR_MODE)
        target = Target(cpus=a.after, generation=time.time_ns() // 1000)
        how = []
        write_atomic(folder, RunLayout.target_name(a.job_id, self.node), target.encode(), 0o600,
                     prepare=lambda fd: how.append(share_read_with(fd, a.uid)))
        if how and how[0] in ("group", "owner") and how[0] not in self._told_sharing:
            self._told_sharing.add(how[0])
            log.warning("targets in %s: no POSIX ACLs there, so job %d's target is %s", folder,
                        a.job_id, "readable by its user's primary group too (mode 0640)"
                        if how[0] == "group" else "root's alone (its user has no passwd entry)")

    def _signal(self, a: Action, ranks: tuple[RankView, ...]) -> None:
        def still_in_job(pid: int) -> bool:   # the job user's, in the job, checked again
            return self._check_pid(pid, a.job_id, self.actuator.layout, a.uid)

        for r in ranks:
            # The signal the rank declared, or none: another one's default action may end it
            # (a real-time signal's does). Checked again here, whoever built the view.
            if r.reload_signal is None or not is_reload_signal(r.reload_signal):
                continue     # it re-reads its target once a second all the same
            # send_signal(pid, sig, check): the check and the signal reach one process, never
            # a pid's next owner (procs.signal_verified: a pidfd opened before the check).
            self._send_signal(r.pid, r.reload_signal, still_in_job)
