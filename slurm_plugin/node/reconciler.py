"""One node's reconcile cycle: observe (feed, cgroups, ledger, ranks) -> decide (a pure policy)
-> execute (cpusets, rank targets and signals) -> report (event log, offers to the job's other
nodes). No slurmctld call anywhere: a cycle takes milliseconds and holds the node's lock only
that long.

The whole cycle holds the node's lock, which the Prolog takes too, so a stale snapshot can
never undo a Prolog's reclaim. Nothing but the ledger survives a cycle: killing the agent at any
moment and starting it again converges.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from malleable_protocol import format_cpu_list

from slurm_plugin.feed.model import JobReport, NodeReport, Offers
from slurm_plugin.feed.store import FeedStore
from slurm_plugin.node.accounting import hand_to_watcher, record_cycle
from slurm_plugin.node.config import AgentConfig
from slurm_plugin.node.core_usage import CoreUsage
from slurm_plugin.node.events import append_event
from malleable_policy.model import Outcome, OutcomeStatus, Policy

from slurm_plugin.node.executor import PlanExecutor
from slurm_plugin.node.ledger import Fence, LedgerFile
from malleable_policy.model import NodeSnapshot, Plan, PlanInvariantError
from slurm_plugin.node.observe import NodeObserver
from malleable_policy.decide import decide
from malleable_policy.whole_cores import SplitCores, decide_whole_cores
from slurm_plugin.node.ranks import RankReader
from slurm_plugin.node.quiet import break_quiet, make_quiet, quiet_possible
from slurm_plugin.node.quiet import gate as quiet_gate
from slurm_plugin.node.switch import switched_off
from slurm_plugin.node.step_gate import StepGate, gated_jobs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hold:
    """Why every job keeps Slurm's allocation on the node this cycle, and the event saying so:
    ``switched-off`` (the site's kill switch), ``cpu-numbering`` (Slurm's CPU ids cannot be
    read as this node's, or Slurm split a core), ``feed-catching-up`` (the node was quiet until
    just now: ``quiet.gate``)."""
    event: str
    why: str


@dataclass
class CycleResult:
    snapshot: NodeSnapshot | None = None
    plan: Plan | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)      # the cycle itself could not run
    lock_busy: bool = False                               # the node's lock was not had in time
    seconds: float = 0.0
    usage: dict[int, CoreUsage] | None = None    # running jobs' (accounting); None: not run
    refusal: Hold | None = None   # why every job keeps Slurm's allocation here

    @property
    def applied(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status is OutcomeStatus.APPLIED]

    @property
    def action_failures(self) -> list[str]:
        """The actions that were not applied (each one job's)."""
        return [f"job {o.action.job_id} {o.action.kind.value} {o.status.value}: {o.error}"
                for o in self.outcomes if o.status is not OutcomeStatus.APPLIED]

    @property
    def failures(self) -> list[str]:
        """Every failure of this cycle, of the cycle or of one action."""
        return self.errors + self.action_failures


@contextmanager
def node_lock(path: Path, timeout_s: float | None = None,
              sleep: Callable[[float], None] = time.sleep):
    path.parent.mkdir(parents=True, exist_ok=True)
    # Root's only (0600): flock needs no write access, so a lock file others can open is a
    # lock any job user can hold, and with it stop every cycle and Prolog on the node.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    if os.fstat(fd).st_mode & 0o077:
        os.fchmod(fd, 0o600)
    with os.fdopen(fd, "r+") as f:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"could not take {path} in {timeout_s:g}s")
                sleep(0.005)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Reconciler:
    def __init__(self, config: AgentConfig, observer: NodeObserver, executor: PlanExecutor,
                 ledger: LedgerFile, store: FeedStore, *,
                 rank_reader: RankReader | None = None,
                 gate: StepGate | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep):
        """``rank_reader``: the budgeted reader the observer and executor share, its budgets
        renewed each cycle. ``gate``: the SPANK plugin's fast path (``step_gate``): its
        fences taken in, its gates closed before and published after each cycle's actions."""
        self.config = config
        self.rank_reader = rank_reader
        self.gate = gate
        self.observer = observer
        self.executor = executor
        self.ledger = ledger
        self.store = store
        self._clock, self._wall, self._sleep = clock, wall, sleep
        self.on_cycle: Callable[[CycleResult], None] | None = None   # metrics, if any
        self._problems: tuple[str, ...] = ()     # the last logged, so each is logged once
        self._faults: tuple[str, ...] = ()
        self._refusal: str | None = None

    def cycle(self, *, lock_timeout_s: float | None = None,
              starting_job: int | None = None,
              fences: Sequence[tuple[int, Fence]] = ()) -> CycleResult:
        """One cycle. ``starting_job`` (the Prolog's job) is marked as starting first: until its
        cores are known, every lent core comes back. ``fences`` (job, Fence: step starts the
        SPANK plugin asked for, any number in one cycle) are marked first too: each job goes
        back to exactly its allocation."""
        t0 = self._clock()
        result = CycleResult()
        try:
            with node_lock(self.config.lock_file, lock_timeout_s, self._sleep):
                self._cycle_locked(result, starting_job, fences)
        except TimeoutError as exc:
            result.lock_busy = True
            result.errors.append(f"{type(exc).__name__}: {exc}")
        except (OSError, ValueError, PlanInvariantError) as exc:
            result.errors.append(f"{type(exc).__name__}: {exc}")
        result.seconds = self._clock() - t0
        for line in self._event_lines(result):
            self._log_event(line)
        if self.on_cycle is not None:
            self.on_cycle(result)
        return result

    def _cycle_locked(self, result: CycleResult, starting_job: int | None,
                      fences: Sequence[tuple[int, Fence]]) -> None:
        if self.rank_reader is not None:
            self.rank_reader.begin_cycle()
        ledger = self.ledger.load()
        if starting_job is not None:
            ledger.starting[starting_job] = self._wall()
            ledger.ended.pop(starting_job, None)     # a requeued job starts again
        for job_id, fence in fences:
            ledger.fences[(job_id, fence.step)] = fence
        fence_files, plugin_fences = self.gate.read_fences() if self.gate is not None \
            else ([], {})
        ledger.fences.update(plugin_fences)
        result.snapshot = self.observer.observe(ledger)
        self.ledger.save(ledger)
        if self.gate is not None:
            self.gate.remove_fences(fence_files)
        quiet = quiet_possible(result.snapshot, ledger, self.observer.feed_malleable)
        if not quiet:
            break_quiet(self.config.quiet_file, self.config.loud_file, self._wall(),
                        self.store.poke_watcher)
        result.refusal, result.plan = self._decide(result.snapshot)
        if self.gate is not None:
            self.gate.close(a.job_id for a in result.plan.actions)
        result.outcomes = self.executor.execute(result.plan, result.snapshot)
        if quiet and not result.action_failures and all(
                result.plan.targets.get(j.job_id, j.current) == j.allocation
                for j in result.snapshot.jobs):
            make_quiet(self.config.quiet_file, self.config.loud_file)
        if self.gate is not None:
            self.gate.publish(gated_jobs(result.snapshot, result.outcomes))
        result.usage = record_cycle(self.ledger, ledger, result, self._wall(), self._log_event,
                                    self._hand_usage)
        self._publish_offers(result.plan)
        self._publish_report(result)

    def _decide(self, snapshot: NodeSnapshot) -> tuple[Hold | None, Plan]:
        """The plan, and why jobs keep Slurm's allocation if they must: where the site switched
        malleability off (``switch``: on this node, or for the site through the feed), Slurm's
        CPU ids cannot be turned into this node's, or the node was quiet until just now
        (``quiet.gate``), nothing is lent (every job is held to what its cgroup shows); where
        cores have several threads, whole cores are lent, or none if Slurm gave a job part of
        one."""
        off = switched_off(self.config) or self.observer.site_switched_off
        if off is not None:
            return Hold("switched-off", off), decide(snapshot, Policy.STATIC)
        refusal, numbering = self.observer.refusal, self.observer.numbering
        if refusal is not None:
            return Hold("cpu-numbering", refusal), decide(snapshot, Policy.STATIC)
        waiting = quiet_gate(self.config.loud_file, self.store.polled_at, self._wall(),
                             self.store.poke_watcher)
        if waiting is not None:
            return Hold("feed-catching-up", waiting), decide(snapshot, Policy.STATIC)
        if numbering is not None and numbering.layout.threads_per_core > 1:
            try:
                return None, decide_whole_cores(snapshot, self.config.policy, numbering.cores)
            except SplitCores as exc:
                return Hold("cpu-numbering", f"{exc}: malleable jobs need whole cores per job "
                            "(CR_Core, CR_Core_Memory, or CR_CPU with ThreadsPerCore "
                            "declared)"), decide(snapshot, Policy.STATIC)
        return None, decide(snapshot, self.config.policy)

    def _hand_usage(self, job_id: int, line: dict) -> None:
        problem = hand_to_watcher(self.store.feed_dir, job_id, line)
        if problem is not None:
            log.warning("%s", problem)

    def _publish_report(self, result: CycleResult) -> None:
        held = {o.action.job_id: o.action.after for o in result.applied}
        report = NodeReport(node=self.config.node, jobs=tuple(
            JobReport(job_id=j.job_id, current=held.get(j.job_id, j.current),
                      threads=tuple(r.intra_active for r in sorted(j.ranks, key=lambda r: r.rank)),
                      steps_per_s=tuple(round(r.rate_now, 2)
                                        for r in sorted(j.ranks, key=lambda r: r.rank)))
            for j in result.snapshot.jobs), problems=result.snapshot.problems,
            held=result.refusal.why if result.refusal is not None else None)
        if report != self.store.read_report(self.config.node):
            self.store.write_report(report)

    def _publish_offers(self, plan: Plan) -> None:
        offers = Offers(node=self.config.node, per_rank=dict(plan.offers))
        old = self.store.read_offers(self.config.node)
        if (old.per_rank if old else {}) != offers.per_rank:
            self.store.write_offers(offers)

    def _event_lines(self, result: CycleResult) -> list[dict]:
        now = self._wall()
        lines = [{"time": now, "node": self.config.node, "event": "cycle-error", "error": e}
                 for e in result.errors]
        if result.snapshot is not None and result.snapshot.problems != self._problems:
            self._problems = result.snapshot.problems
            lines += [{"time": now, "node": self.config.node, "event": "unverified-job",
                       "error": p} for p in self._problems]
        if result.snapshot is not None and result.refusal != self._refusal:
            self._refusal = result.refusal
            if result.refusal is not None:
                # Waiting for the feed is a second's ordinary business; the others need a look.
                level = logging.INFO if result.refusal.event == "feed-catching-up" \
                    else logging.ERROR
                log.log(level, "node %s: jobs keep Slurm's allocation: %s", self.config.node,
                        result.refusal.why)
                lines.append({"time": now, "node": self.config.node,
                              "event": result.refusal.event, "error": result.refusal.why})
        if result.snapshot is not None and result.snapshot.faults != self._faults:
            self._faults = result.snapshot.faults
            lines += [{"time": now, "node": self.config.node, "event": "job-fault",
                       "error": f} for f in self._faults]
        for o in result.outcomes:
            a = o.action
            lines.append({"time": now, "node": self.config.node, "job": a.job_id,
                          "event": a.kind.value, "status": o.status.value,
                          "before": format_cpu_list(a.before), "after": format_cpu_list(a.after),
                          "threads_per_rank": list(a.threads_per_rank),
                          "reason": a.reason.value, "latency_ms": o.latency_ms,
                          **({"error": o.error} if o.error else {})})
        return lines

    def _log_event(self, line: dict) -> None:
        text = json.dumps(line, sort_keys=True)
        (log.info if line.get("status") == "applied" else log.warning)("%s", text)
        try:
            append_event(self.config.event_log, text)
        except OSError as exc:
            log.warning("cannot write event log: %s", exc)

    def run(self, stop: Callable[[], bool], wake=None,
            serve: Callable[[], None] | None = None, feed_changed=None) -> None:
        """Cycle every ``interval_s``, at once when the node's feed changes or ``wake`` (an
        Event) is set, until ``stop()``. ``serve``: called first on every turn of the loop
        (the step starts the SPANK plugin asked for), on this thread like every cycle.
        ``feed_changed`` (an Event): set by whoever learns of a feed change without a stat
        (inotify, the watcher's wake; notify.py); the store's cached reads are dropped then.
        The feed file itself is stat-ed every turn, or every ``refresh_s`` of the store."""
        stamp = self.store.node_stamp(self.config.node)
        next_at = self._clock()
        while not stop():
            if serve is not None:
                serve()
            changed, stamp = self.store.node_changed(self.config.node, stamp)
            if feed_changed is not None and feed_changed.is_set():
                feed_changed.clear()
                self.store.invalidate()
                changed = True
            woken = wake is not None and wake.is_set()
            if woken or changed or self._clock() >= next_at:
                if wake is not None:
                    wake.clear()
                result = self.cycle()
                next_at = self._clock() + self.config.interval_s
                if result.errors:
                    next_at += self.config.interval_s * 4    # back off; a later cycle repairs
            if wake is not None:
                wake.wait(self.config.feed_check_s)
            else:
                self._sleep(self.config.feed_check_s)
