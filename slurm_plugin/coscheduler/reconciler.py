"""One node's reconcile loop: observe (Slurm, cgroups, rank telemetry) -> decide (a pure
policy) -> act (cpusets, rank targets and signals), then log what changed.

No state of its own survives a cycle: everything is read again from Slurm and the cgroups, so
killing the agent at any moment and starting it again converges. The whole cycle holds the
node's lock, which the Prolog takes too, so a stale snapshot can never undo a Prolog's reclaim.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..cpulist import format_cpu_list
from ..runner import CommandError
from ..slurm import Job, SlurmClient
from ..slurm.parsers import SlurmParseError
from .cgroup_actuator import ActuatorError, CpusetActuator
from .config import AgentConfig
from .model import JobView, NodeSnapshot, Plan
from .policy import decide
from .request import RequestError, apply_update, is_malleable_text, parse_submit, parse_update
from .telemetry_reader import RankStatus, read_job_ranks, status_dir

log = logging.getLogger("malleable.agent")


@dataclass
class Change:
    job_id: int
    before: frozenset[int]
    after: frozenset[int]
    reason: str
    latency_ms: float = 0.0


@dataclass
class CycleResult:
    plan: Plan | None
    changes: list[Change] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    snapshot: NodeSnapshot | None = None
    seconds: float = 0.0


def job_spec_and_request(job: Job):
    """Bounds from AdminComment (written by job_submit.lua; users cannot forge it), updated and
    requested cpus from Comment (the owner's or an admin's scontrol update). Malformed text is
    ignored: it changes nothing."""
    if not is_malleable_text(job.admin_comment):
        return None, None
    try:
        spec = parse_submit(job.admin_comment)
    except RequestError:
        return None, None
    requested = None
    if is_malleable_text(job.comment):
        try:
            up = parse_update(job.comment)
            spec = apply_update(spec, up)
            requested = up.cpus
        except RequestError:
            pass
    return spec, requested


@dataclass
class Observation:
    snapshot: NodeSnapshot
    jobs: dict[int, Job]
    ranks: dict[int, list[RankStatus]]
    # Jobs whose cgroup does not exist yet (the Prolog runs before the step makes it): Slurm
    # creates it on exactly the allocation, so there is nothing to write.
    no_folder: set[int]


@contextmanager
def node_lock(path: Path, timeout_s: float | None = None):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"could not take {path}")
                time.sleep(0.005)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Reconciler:
    def __init__(self, config: AgentConfig, client: SlurmClient, actuator: CpusetActuator, *,
                 read_ranks: Callable[[Path, int, str], list[RankStatus]] = read_job_ranks,
                 send_signal: Callable[[int, int], None] = os.kill,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.config = config
        self.client = client
        self.actuator = actuator
        self._read_ranks = read_ranks
        self._send_signal = send_signal
        self._clock = clock
        self._sleep = sleep
        self.on_cycle: Callable[[CycleResult], None] | None = None   # metrics, if any

    # --- observe ---------------------------------------------------------------------------

    def observe(self) -> Observation:
        node = self.config.node
        nodes = {n.name: n for n in self.client.nodes()}
        if node not in nodes:
            raise RuntimeError(f"Slurm knows no node {node!r}")
        jobs = [j for j in self.client.jobs(node=node) if j.state.holds_cores and node in j.cpu_ids]
        views, by_id, ranks, no_folder = [], {}, {}, set()
        for j in jobs:
            slurm = j.cpu_ids[node]
            current = self.actuator.current(j.uid, j.job_id)
            if current is None:
                current = slurm
                no_folder.add(j.job_id)
            spec, requested = job_spec_and_request(j)
            rs = self._read_ranks(self.config.status_base, j.job_id, node) if spec else []
            ranks[j.job_id] = rs
            views.append(JobView(job_id=j.job_id, user=j.user, slurm_cpus=slurm,
                                 current_cpus=current, spec=spec, requested_cpus=requested,
                                 steps_per_s=_node_rates(rs)))
            by_id[j.job_id] = j
        cpus = frozenset(range(nodes[node].cpus))
        return Observation(NodeSnapshot(node=node, cpus=cpus, jobs=tuple(views)), by_id, ranks,
                           no_folder)

    # --- one cycle -------------------------------------------------------------------------

    def cycle(self, *, lock_timeout_s: float | None = None) -> CycleResult:
        t0 = self._clock()
        try:
            with node_lock(self.config.lock_file, lock_timeout_s):
                result = self._cycle_locked()
        except (CommandError, SlurmParseError, RuntimeError, TimeoutError) as exc:
            # slurmctld unreachable and the like: keep the cpusets as they are.
            result = CycleResult(plan=None, errors=[str(exc)])
        result.seconds = self._clock() - t0
        if self.on_cycle is not None:
            self.on_cycle(result)
        return result

    def _cycle_locked(self) -> CycleResult:
        seen = self.observe()
        snapshot, jobs, ranks = seen.snapshot, seen.jobs, seen.ranks
        plan = decide(snapshot, self.config.policy)
        result = CycleResult(plan=plan, snapshot=snapshot)
        changes = {jid: c for jid, c in plan.changes(snapshot).items()
                   if jid not in seen.no_folder}
        # Shrinks before grows: a core is released before anyone else is given it.
        order = sorted(changes, key=lambda jid: len(changes[jid][1]) - len(changes[jid][0]))
        for jid in order:
            before, after = changes[jid]
            t0 = self._clock()
            try:
                self._apply(jobs[jid], before, after, ranks.get(jid, []))
            except (ActuatorError, ValueError) as exc:
                result.errors.append(f"job {jid}: {exc}")
                continue
            ch = Change(jid, before, after, plan.reasons.get(jid, ""),
                        round((self._clock() - t0) * 1000, 3))
            result.changes.append(ch)
            self._log_event(ch)
        # Steps whose folders Slurm reset (a new step) are put back in line.
        for view in snapshot.jobs:
            if view.job_id not in changes and view.job_id not in seen.no_folder:
                try:
                    self.actuator.apply(jobs[view.job_id].uid, view.job_id,
                                        plan.targets[view.job_id], view.slurm_cpus)
                except (ActuatorError, ValueError):
                    pass
        return result

    def _apply(self, job: Job, before: frozenset[int], after: frozenset[int],
               ranks: list[RankStatus]) -> None:
        per_rank = max(1, len(after) // max(1, len(ranks)))
        if not ranks:
            self.actuator.apply(job.uid, job.job_id, after, job.cpu_ids[self.config.node])
            return
        self._write_target(job.job_id, per_rank)
        if len(after) < len(before):
            # Threads drop no later than the cpuset: the ranks park first (briefly awaited).
            self._signal(ranks)
            self._wait_parked(job.job_id, per_rank)
        self.actuator.apply(job.uid, job.job_id, after, job.cpu_ids[self.config.node])
        self._signal(ranks)   # grown: use the new cores; shrunk: re-pin to the narrower set

    def _write_target(self, job_id: int, intra: int) -> None:
        """The ranks of this job on this node read target-<node>.json on a reload signal."""
        folder = status_dir(self.config.status_base, job_id)
        if not folder.is_dir():
            return
        tmp = folder / f".target-{self.config.node}.json.tmp"
        tmp.write_text(json.dumps({"intra": intra, "inter": intra}))
        os.replace(tmp, folder / f"target-{self.config.node}.json")

    def _signal(self, ranks: list[RankStatus]) -> None:
        for r in ranks:
            try:
                self._send_signal(r.pid, signal.SIGUSR1)
            except (ProcessLookupError, PermissionError):
                pass

    def _wait_parked(self, job_id: int, per_rank: int) -> None:
        deadline = self._clock() + self.config.shrink_wait_s
        while self._clock() < deadline:
            rs = self._read_ranks(self.config.status_base, job_id, self.config.node)
            if all(r.intra_active <= per_rank for r in rs):
                return
            self._sleep(0.005)

    def _log_event(self, ch: Change) -> None:
        line = json.dumps({"time": time.time(), "node": self.config.node, "job": ch.job_id,
                           "before": format_cpu_list(ch.before), "after": format_cpu_list(ch.after),
                           "reason": ch.reason, "latency_ms": ch.latency_ms})
        log.info("resize %s", line)
        try:
            self.config.event_log.parent.mkdir(parents=True, exist_ok=True)
            with open(self.config.event_log, "a") as f:
                f.write(line + "\n")
        except OSError as exc:
            log.warning("cannot write event log: %s", exc)

    # --- the loop ---------------------------------------------------------------------------

    def run(self, stop: Callable[[], bool], wake=None) -> None:
        """Cycle every ``interval_s`` until ``stop()``; ``wake`` (an Event) cuts a wait short.
        Failures back off up to 10 intervals and recover by themselves."""
        backoff = self.config.interval_s
        while not stop():
            result = self.cycle()
            if result.errors:
                log.warning("cycle: %s", "; ".join(result.errors))
                backoff = min(backoff * 2, self.config.interval_s * 10) if result.plan is None \
                    else self.config.interval_s
            else:
                backoff = self.config.interval_s
            if wake is not None:
                wake.wait(backoff)
                wake.clear()
            else:
                self._sleep(backoff)


def _node_rates(ranks: list[RankStatus]) -> dict[int, float]:
    """A job's steps/s on this node by per-rank thread count: the mean over its ranks, scaled
    to node cores (ranks * threads) so policies compare cores with cores."""
    if not ranks:
        return {}
    n = len(ranks)
    sums: dict[int, list[float]] = {}
    for r in ranks:
        for k, v in r.steps_per_s.items():
            sums.setdefault(k * n, []).append(v)
    return {k: sum(v) / len(v) for k, v in sums.items() if len(v) == n}
