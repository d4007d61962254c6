"""A discrete-event simulation of a cluster whose nodes run the co-scheduler's own policy.

Slurm's part is the stand-in of ``slurm_standin`` (its schedulers on slurmctld's clocks,
select/cons_tres's placement, conservative or EASY backfill); ``config`` holds the regimes and
Slurm's settings, ``results`` what a run gives.

The nodes' part is the agents': on every node where a job started or ended,
``malleable_policy.decide`` (the same function the agent runs, invariants checked) is given a
NodeSnapshot with each job's allocation there, its current cores and the steps/s it has shown
(each core count a job has run at is known once it ran there: the telemetry), and each job
then holds the cores of the plan. A job on one node is one process whose threads follow its
cores; a job on several is an MPI job with a rank per allocated core whose threads follow, and
each node's agent offers it cores per rank (``Plan.offers``) and gives it no more per rank than
the smallest offer of its other nodes (``JobView.peer_cap_per_rank``, as the agents read it from
the feed): its ranks do equal work, so it runs at its slowest rank's pace. A job first spends
its ``startup_s`` (launch, imports: no shorter on more cores), then progresses at its speedup
curve's rate for the cores its threads use:

    static        every job asks for its size; Slurm's allocation (no agent: decide is not
                  called)
    static-ask    malleable jobs ask for ``malleable_ask`` of their size, as under lend-idle
                  and throughput, and run on that allocation (no agent): what asking for less
                  does on its own, apart from the agent's effect
    moldable      malleable jobs ask for the fixed size an oracle of their speedup curve
                  picks (``workload.moldable_size``: the processor working set, up to the size
                  asked for), no agent: what the speedup model gives without malleability
    cgroup-only   every job asks for its size; decide(LEND_IDLE) moves the cgroups, but the
                  threads stay as many as at start (what `docker update` or a cpuset-only agent
                  gives): rate at min(cores held, allocation)
    lend-idle     malleable jobs ask for ``malleable_ask``; decide(LEND_IDLE): the cores of
                  the plan
    throughput    malleable jobs ask for ``malleable_ask``; decide(THROUGHPUT): the cores of
                  the plan
    nodes         every job asks for its size, no agent; a malleable job that holds whole nodes
                  changes its node count as ``scontrol update JobId=J NumNodes=N`` shrinks a
                  running job and an expand job grows it (``NodeBounds``): when the job first in
                  Slurm's queue does not fit, running malleable jobs give back whole nodes
                  (grown ones first, none below ``shrink_to`` of its nodes) if that lets it start
                  now; after a backfill pass (or with nothing queued), wholly idle nodes go one
                  at a time to the malleable job whose speedup gains the most from a whole node
                  more (at least ``min_gain`` of its cores' average worth, up to ``grow_to``
                  times its nodes). Its width is then all the cores of its nodes.
"""
from __future__ import annotations

import bisect
import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from malleable_policy.decide import decide
from malleable_policy.model import JobView, NodeSnapshot, RankView

from .config import (BF_WINDOW_S, Backfill, NodeBounds, Placement, QueueOrder, ResizeCosts,
                     SimPolicy, SlurmPass, TimeLimits)
from .metrics import bounded_slowdown, percentile
from .results import JobResult, SimResult
from .slurm_standin import (BackfillProfile, JobQueue, Reservation, eval_nodes, peer_cap,
                            select_nodes)
from .workload import SimJob, fluid_lower_bound


@dataclass
class _Running:
    """A running job: per node of its allocation (in node order), Slurm's cores there, the
    cores the agent gives it there, what its rank there has measured and what that node's agent
    offers it per rank."""

    job: SimJob
    nodes: tuple[int, ...]
    allocation: tuple[frozenset[int], ...]
    current: list[frozenset[int]]
    remaining: float          # work units left
    since: float              # when remaining was last brought up to date
    ready_at: float           # start-up over: work begins
    expected_end: float       # Slurm's view: start + time limit
    rate: float = 0.0
    cores_used: int = 0       # cores the job's threads use now, over its nodes
    version: int = 0          # bumps on each rate change: older completion events are stale
    known: list[dict[int, float]] = field(default_factory=list)  # steps/s by cores, per node
    offers: list[int | None] = field(default_factory=list)        # per rank, per node
    caps: list[int | None] = field(default_factory=list)          # the peer cap last used
    index: dict[int, int] = field(default_factory=dict)           # node -> its position
    # Its ranks per node: a job on one node is one process whose threads follow its cores (a
    # malleable_tf worker); a job on several is an MPI job with a rank per allocated core
    # (SWF's processors), each rank's threads following its share.
    ranks: tuple[int, ...] = (1,)
    # Per node index, the agent's last view of the job there: made again only when the objects
    # it shows (cores, allocation, steps/s dict: compared by identity, which the view keeps
    # alive) or its peer cap changed. The steps/s dict is shared, so the view reads it live.
    # Made for every job at every replan, views cost a tenth of a cgroup-only run.
    views: dict[int, JobView] = field(default_factory=dict)
    no_grow_until: float = 0.0    # the nodes regime's hysteresis (NodeBounds.regrow_after_s)

    @property
    def multi_node(self) -> bool:
        return len(self.nodes) > 1

    def usage(self, cgroup_only: bool) -> tuple[int, int]:
        """The cores its threads use, and the width its speed is that of. Where its threads
        follow, they use the cores of the plan; with cgroups only, never more than the
        allocation. The ranks of a job on several nodes do equal work, so it runs at its
        slowest rank's threads on every rank."""
        if not self.multi_node:
            used = len(self.current[0])
            used = min(used, len(self.allocation[0])) if cgroup_only else used
            return used, used
        per_node = [min(len(c), len(a)) if cgroup_only else len(c)
                    for c, a in zip(self.current, self.allocation)]
        threads = min(u // k for u, k in zip(per_node, self.ranks))
        return sum(per_node), self.job.cores * threads


PEER_ROUNDS = 3


class Simulation:
    """One run. ``clock`` only measures wall_s (injected for tests)."""

    def __init__(self, jobs: Sequence[SimJob], *, nodes: int, cores: int, policy: SimPolicy,
                 backfill: Backfill = Backfill.CONSERVATIVE, backfill_depth: int = 500,
                 backfill_interval_s: float = 30.0, queue_order: QueueOrder = QueueOrder.FCFS,
                 node_bounds: NodeBounds = NodeBounds(),
                 placement: Placement = Placement.SLURM_TASKS,
                 backfill_phase_s: float = 0.0, batch_sched_delay_s: float = 3.0,
                 backfill_window_s: float = BF_WINDOW_S,
                 resize_costs: ResizeCosts = ResizeCosts(),
                 time_limits: TimeLimits = TimeLimits.IGNORED,
                 slurm_pass: SlurmPass | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        for j in jobs:
            if not 1 <= j.cores <= nodes * cores:
                raise ValueError(f"job {j.job_id} asks for {j.cores} cores; the cluster has "
                                 f"{nodes} x {cores}")
        self.jobs = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
        self.nodes, self.cores, self.policy = nodes, cores, policy
        self.backfill = backfill
        self.backfill_depth = backfill_depth     # Slurm's bf_max_job_test (500 by default)
        self.backfill_interval_s = backfill_interval_s
        if backfill_interval_s <= 0 or batch_sched_delay_s < 0 or backfill_window_s <= 0:
            raise ValueError("backfill_interval_s and backfill_window_s must be positive, "
                             "batch_sched_delay_s not negative")
        self.backfill_window_s = backfill_window_s   # Slurm's bf_window (conservative only)
        self.backfill_phase_s = backfill_phase_s
        self.batch_sched_delay_s = batch_sched_delay_s
        self._last_main = -math.inf    # when the main scheduler last ran
        self._main_due = False         # a deferred main pass is queued
        self.node_bounds = node_bounds
        self.placement = placement
        self.resize_costs = resize_costs
        self.time_limits = time_limits
        # Slurm 22.05's own pass instead of the stand-in's conservative one (config.SlurmPass).
        if slurm_pass is not None and (backfill is not Backfill.CONSERVATIVE
                                       or policy is not SimPolicy.STATIC):
            raise ValueError("slurm_pass models Slurm's conservative backfill of rigid jobs: "
                             "backfill conservative, policy static")
        self.slurm_pass = slurm_pass
        self._ctld_clock_s = slurm_pass.clock_s if slurm_pass else 0.0
        self.paused_core_s = 0.0        # cores held while resizes paused their jobs
        self._backfill_due = False     # a backfill pass is queued
        self._news = True              # a job arrived or ended since the last backfill pass
        self._clock = clock
        self._cpus = frozenset(range(cores))
        self._running: dict[int, _Running] = {}
        self._on_node: list[set[int]] = [set() for _ in range(nodes)]
        self._allocated: list[set[int]] = [set() for _ in range(nodes)]
        self._free: list[int] = [cores] * nodes     # Slurm's view: cores no job was allocated
        self._free_total = nodes * cores
        # Nodes by free cores: best fit is the first non-empty bucket >= need.
        self._by_free: list[set[int]] = [set() for _ in range(cores + 1)]
        self._by_free[cores] = set(range(nodes))
        # Per node, (expected end, job, cores there) of its running jobs, sorted: reservations;
        # and all of them as (expected end, job, node, cores), sorted (backfill's wide search).
        self._ends_on: list[list[tuple[float, int, int]]] = [[] for _ in range(nodes)]
        self._ends: list[tuple[float, int, int, int]] = []
        self._events: list[tuple] = []
        self._seq = 0
        self._queue = JobQueue(queue_order)
        self._starts: dict[int, float] = {}
        self._results: list[JobResult] = []
        self._busy_core_s = 0.0
        self._dirty: set[int] = set()       # nodes whose agent must plan again this instant
        self._touched: set[int] = set()     # jobs whose cores changed this instant
        self.resizes = 0
        self.decide_calls = 0
        # The nodes regime's growth candidates, kept between events (a job's gain from a node
        # more changes only when its nodes do): a heap of (-gain, job, stamp), an entry valid
        # while its stamp is the job's in _gain_stamp (lazy deletion).
        self._gain_heap: list[tuple[float, int, int]] = []
        self._gain_stamp: dict[int, int] = {}
        self._stamps = 0
        self._node_jobs: set[int] = set()   # the running jobs _node_malleable holds for
        # Of those, the ones with whole nodes to give back: their _releasable entries.
        self._release_entries: dict[int, list[tuple[tuple, int, int]]] = {}

    # --- the event loop ---------------------------------------------------------------------

    def _push(self, t: float, kind: int, payload) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, payload))

    def run(self) -> SimResult:
        t0 = self._clock()
        for j in self.jobs:
            self._push(j.submit_s, 1, j)
        now, backfill, main = 0.0, False, False
        while self._events:
            now, kind, _, payload = heapq.heappop(self._events)
            if kind == 0:                          # an end (ends first at equal times)
                job_id, version = payload
                r = self._running.get(job_id)
                if r is not None and r.version == version:   # else stale: its rate changed
                    self._finish(r, now)
                    self._news = main = True
            elif kind == 1:
                self._queue.push(payload)
                self._news = main = True
            elif kind == 2:                        # the periodic backfill pass
                self._backfill_due = False
                # With no arrival and no end since the last pass, a pass starts nothing: every
                # job's earliest start is anchored on an end to come (or on now, then it ran).
                backfill = self._news
                self._news = False
            elif kind == 5:                        # a job's hold-off on growing is over
                r = self._running.get(payload)
                if r is not None:
                    self._regain(r, now)
                    self._news = main = True
            elif kind == 4:                        # a time limit (after an end at that time)
                r = self._running.get(payload)
                if r is not None:
                    self._finish(r, now, timed_out=True)
                    self._news = main = True
            else:                                  # a main pass deferred by batch_sched_delay
                self._main_due = False
                main = True
            if self._events and self._events[0][0] == now:
                continue                           # settle every event of this instant first
            if main and now < self._last_main + self.batch_sched_delay_s:
                main = False                       # slurmctld calls schedule() later
                if not self._main_due:
                    self._main_due = True
                    self._push(self._last_main + self.batch_sched_delay_s, 3, None)
            self._schedule(now, main=main, backfill=backfill)
            backfill = main = False
            if self._queue and not self._backfill_due:
                self._backfill_due = True
                self._push(self._next_backfill(now), 2, None)
        if self._queue or self._running:
            raise RuntimeError(f"{len(self._queue)} jobs never started, "
                               f"{len(self._running)} never ended")
        return self._result(self._clock() - t0)

    def _next_backfill(self, now: float) -> float:
        """The first pass of the fixed cadence strictly after ``now``."""
        k = math.floor((now - self.backfill_phase_s) / self.backfill_interval_s) + 1
        t = self.backfill_phase_s + k * self.backfill_interval_s
        while t <= now:          # rounding put it at now: the pass after
            k += 1
            t = self.backfill_phase_s + k * self.backfill_interval_s
        return t

    def _schedule(self, now: float, *, main: bool, backfill: bool) -> None:
        if main:
            self._last_main = now
        # The main scheduler's queue-order starts; a backfill pass starts the same jobs first
        # (the head fits now: nothing is reserved before it).
        while (main or backfill) and self._queue and self._fits_now(self._queue.first()):
            job = self._queue.pop()
            self._start(job, self._place(job), now)
        if backfill and self._queue:
            window = [self._queue.pop()
                      for _ in range(min(self.backfill_depth, len(self._queue)))]
            waiting = self._easy(window, now) if self.backfill is Backfill.EASY else \
                self._slurm_conservative(window, now) if self.slurm_pass else \
                self._conservative(window, now)
            for job in waiting:
                self._queue.push(job)
        if self.policy is SimPolicy.NODES:
            self._shrink_for_head(now)
            if backfill or not self._queue:
                self._grow_into_idle(now)
        self._settle_agents(now)

    def _easy(self, window: list[SimJob], now: float) -> list[SimJob]:
        """EASY backfill over the window (queue order): the first job is reserved, the others
        start where they cannot delay it. Returns the jobs still waiting."""
        head, waiting = window[0], [window[0]]
        reservation = self._reserve(head, now)
        for job in window[1:]:
            end = now + job.expected_s
            placement = self._place(job, reservation, end)
            if placement is None:
                waiting.append(job)
                continue
            for node, k in placement.items():
                reservation.book(node, k, end)
            self._start(job, placement, now)
        return waiting

    def _conservative(self, window: list[SimJob], now: float) -> list[SimJob]:
        """Slurm's backfill over the window (queue order): each job starts now where it fits
        without delaying the reservations before it, else it is reserved at the earliest time
        it fits. Returns the jobs still waiting."""
        profile = BackfillProfile(self._free, self._ends_on, self.cores, now, self._ends)
        # From each job on, the fewest cores asked by a job on one node, and by a wider one:
        # once no job left could start now, its reservation changes nothing this pass.
        least_one, least_wide = [self.cores + 1], [self.nodes * self.cores + 1]
        for job in reversed(window):
            one = self._one_node(job)
            least_one.append(min(least_one[-1], job.cores if one else self.cores + 1))
            least_wide.append(min(least_wide[-1], self.nodes * self.cores + 1 if one
                                  else job.cores))
        least_one.reverse()
        least_wide.reverse()
        horizon = now + self.backfill_window_s
        waiting = []
        for i, job in enumerate(window):
            if least_one[i] > self._max_free() and least_wide[i] > self._free_total:
                return waiting + window[i:]
            length = job.expected_s
            node = self._best_fit_clear(job.cores, length, profile, now) \
                if job.cores <= self.cores else None
            if node is not None:
                start, placement = now, {node: job.cores}
            elif self._one_node(job):
                start, node = profile.earliest_on_one(job.cores, length)
                placement = {node: job.cores}
            else:     # wider than a node, or spread: one node if one holds it then
                start, placement = profile.earliest_wide(job.cores, length, horizon)
            if start > horizon:
                waiting.append(job)     # beyond bf_window: no reservation
                continue
            # A job past its expected end that still runs (by a rounding error) holds its
            # cores: a start planned on them waits for its end, at once.
            if start <= now and all(self._free[n] >= k for n, k in placement.items()):
                self._start(job, placement, now)
                profile.started(placement, now + job.expected_s)
            else:
                profile.reserve(placement, max(start, now), length)
                waiting.append(job)
        return waiting

    # --- Slurm 22.05's backfill pass, literally (config.SlurmPass; small clusters only) -------

    def _sec(self, t: float) -> float:
        """The whole second of slurmctld's clock at simulated time t (time(NULL)), in
        simulated time."""
        return math.floor(t + self._ctld_clock_s + 1e-9) - self._ctld_clock_s

    def _slurm_end(self, r: _Running) -> float:
        """Slurm's end_time of a running job: its whole-second start + its limit."""
        return self._sec(self._starts[r.job.job_id]) + r.job.expected_s

    def _slurm_will_run(self, job: SimJob, avail: set[int], now: float
                        ) -> tuple[float, dict[int, int]] | None:
        """select/cons_tres's _will_run_test (cons_common/job_test.c, 22.05): the job now on
        the nodes' free cores; else the running jobs (with a node in ``avail``) are removed in
        order of their end time, in groups: the first group ends at the 30 s barrier after the
        first end (end + 30 - end % 30, on slurmctld's clock) + 30 s, the window then doubling
        until the next end is within it; the job is tested after each group and its start is
        the end of the LAST job removed (a job already past its end: that end + KillWait, at
        least now + 1)."""
        free = [f if n in avail else 0 for n, f in enumerate(self._free)]
        placement = eval_nodes(free, job.cores)
        if placement is not None:
            return self._sec(now), placement
        # (end, job id, job): the id breaks ties, so jobs are never compared.
        ends = sorted((self._slurm_end(r), r.job.job_id, r) for r in self._running.values())
        barrier: float | None = None
        window, i = 30.0, 0
        while i < len(ends):
            last_end: float | None = None
            next_end: float | None = None
            while i < len(ends):
                end, _, r = ends[i]
                i += 1
                if not avail.intersection(r.nodes):
                    continue
                if barrier is None:
                    e = round(end + self._ctld_clock_s)
                    barrier = end + (30 - e % 30)
                last_end = end
                for node, alloc in zip(r.nodes, r.allocation):
                    if node in avail:
                        free[node] += len(alloc)
                next_end = ends[i][0] if i < len(ends) else None
                if next_end is None or next_end > barrier + window:
                    break
            if last_end is None or barrier is None:
                break
            while next_end is not None and next_end > barrier + window:
                window *= 2
            placement = eval_nodes(free, job.cores)
            if placement is not None:
                end = last_end
                if end <= self._sec(now):
                    end = max(end + 5.0, self._sec(now) + 1)     # _guess_job_end, KillWait=5
                return end, placement
        return None

    def _slurm_conservative(self, window: list[SimJob], now: float) -> list[SimJob]:
        """sched/backfill's _attempt_backfill (22.05) over the window, in queue order, with
        its node space map: reservations (start, end, nodes) of whole nodes; a job is tested at
        start_res (now, then the later times the map gives: TRY_LATER) on the nodes no
        reservation holds within [start_res, start_res + limit]; its start is _will_run's,
        not before start_res; it starts if that is now, else it is reserved there unless it
        is beyond bf_window or its nodes overlap a reservation then (tried again from its
        start). Returns the jobs still waiting."""
        nodes = set(range(self.nodes))
        resv: list[tuple[float, float, frozenset[int]]] = []
        t_now = self._sec(now)
        horizon = t_now + self.backfill_window_s
        waiting = []

        def reserved(a: float, b: float) -> set[int]:
            """Nodes reserved in a map record overlapping [a, b] (end > a, begin <= b)."""
            out: set[int] = set()
            for s, e, ns in resv:
                if e > a and s <= b:
                    out |= ns
            return out

        for job in window:
            limit = job.expected_s
            start_res = t_now
            for _ in range(1000):
                end_win = start_res + limit
                avail = nodes - reserved(start_res, end_win)
                # later_start (the loop over the node space map's records): the end of the first
                # record from start_res whose next record frees a node reserved in the records
                # seen so far (those from start_res to the window's end, and one past it)
                bounds = sorted({t_now, horizon} | {x for a, b, _ in resv for x in (a, b)
                                                    if t_now < x < horizon})
                later = 0.0
                seen: set[int] = set()
                for k in range(len(bounds) - 1):
                    b0, b1 = bounds[k], bounds[k + 1]
                    if b1 <= start_res:
                        continue
                    here = {n for a, b, ns in resv if a <= b0 < b for n in ns}
                    if k + 2 < len(bounds) and not later:
                        nxt_free = nodes - {n for a, b, ns in resv if a <= b1 < b for n in ns}
                        if nxt_free - (nodes - seen - here):
                            later = b1
                    if b0 > end_win:
                        break
                    seen |= here
                found = self._slurm_will_run(job, avail, now) if avail else None
                if found is None:
                    if later:
                        start_res = later
                        continue
                    waiting.append(job)
                    break
                start, placement = found
                start = max(start, start_res)
                if start <= t_now:
                    self._start(job, placement, now)
                    break
                if later and start > later:
                    start_res = later
                    continue
                if start > horizon:
                    waiting.append(job)
                    break
                over = {n for s, e, ns in resv if e > start and s < start + limit for n in ns}
                if over & set(placement):
                    start_res = start
                    continue
                resv.append((start, start + limit, frozenset(placement)))
                waiting.append(job)
                break
            else:
                waiting.append(job)
        return waiting

    def _best_fit_clear(self, need: int, length: float, profile: BackfillProfile,
                        now: float) -> int | None:
        """The best-fit node that holds ``need`` cores now and that no reservation of this
        pass holds within ``length`` from now (None if none): the common case, without the
        search of every node's future."""
        for free in range(need, self.cores + 1):
            for node in self._by_free[free]:
                if profile.clear_from(node, now, length) == now:
                    return node
        return None

    # --- Slurm's view -----------------------------------------------------------------------

    def _one_node(self, job: SimJob) -> bool:
        """Whether the job goes on one node only: it fits a node and the placement keeps it
        there (else its cores may be spread, as a wider job's are)."""
        return job.cores <= self.cores and self.placement is Placement.ONE_NODE

    def _max_free(self) -> int:
        return next((free for free in range(self.cores, 0, -1) if self._by_free[free]), 0)

    def _fits_now(self, job: SimJob) -> bool:
        if self._one_node(job):
            return any(self._by_free[free] for free in range(job.cores, self.cores + 1))
        return job.cores <= self._free_total

    def _place(self, job: SimJob, reservation: Reservation | None = None,
               expected_end: float = 0.0) -> dict[int, int] | None:
        """Where Slurm starts the job now: cores per node, or None. A job that fits a node
        gets one (best fit), else (``Placement.SLURM_TASKS`` only) nodes as a wider one does;
        a wider one, nodes by ``select_nodes``."""
        if self.slurm_pass and reservation is None:
            return eval_nodes(self._free, job.cores)     # cons_tres's _eval_nodes
        if job.cores <= self.cores:
            node = self._best_fit(job.cores, reservation, expected_end)
            if node is not None:
                return {node: job.cores}
            if self._one_node(job):
                return None
        if job.cores > self._free_total:
            return None
        usable: list[int] = self._free if reservation is None else \
            [reservation.usable(n, f, expected_end) for n, f in enumerate(self._free)]
        return select_nodes(usable, job.cores, self.cores)

    def _best_fit(self, need: int, reservation: Reservation | None = None,
                  expected_end: float = 0.0) -> int | None:
        """The node with the fewest free cores that still holds ``need`` and where a job
        expected to end at ``expected_end`` cannot delay the reservation (deterministic: the
        buckets are sets of ints, iterated in the order CPython keeps them); None if none."""
        for free in range(need, self.cores + 1):
            for node in self._by_free[free]:
                if reservation is None or reservation.usable(node, free, expected_end) >= need:
                    return node
        return None

    def _reserve(self, job: SimJob, now: float) -> Reservation:
        """When and where the job will fit by the running jobs' expected ends, and how many
        cores each of those nodes has spare then beyond it."""
        if self._one_node(job):
            best: tuple[float, int, int] | None = None   # (time, node, spare cores then)
            for node in range(self.nodes):
                free, at = self._free[node], now
                for end, _, cores in self._ends_on[node]:
                    if free >= job.cores or (best is not None and end >= best[0]):
                        break
                    free += cores
                    at = max(now, end)
                if free >= job.cores and (best is None or at < best[0]):
                    best = (at, node, free - job.cores)
            assert best is not None, "every job fits an empty node"
            return Reservation(start=best[0], spare={best[1]: best[2]})
        # Wider than a node (or spread): the first instant the cluster has its cores free, on
        # the nodes select_nodes picks from what is free then (one node if one holds it).
        free, total, at = list(self._free), self._free_total, now
        ends = heapq.merge(*([(end, node, cores) for end, _, cores in lst]
                             for node, lst in enumerate(self._ends_on)))
        for end, node, cores in ends:
            if total >= job.cores and end > at:
                break
            free[node] += cores
            total += cores
            at = max(now, end)
        placement = select_nodes(free, job.cores, self.cores)
        assert placement is not None, "every job fits the empty cluster"
        return Reservation(start=at, spare={n: free[n] - k for n, k in placement.items()})

    def _hold(self, node: int, expected_end: float, job_id: int, cores: int) -> None:
        """A running job holds ``cores`` of the node until its expected end (Slurm's view)."""
        bisect.insort(self._ends_on[node], (expected_end, job_id, cores))
        bisect.insort(self._ends, (expected_end, job_id, node, cores))

    def _unhold(self, node: int, expected_end: float, job_id: int, cores: int) -> None:
        self._ends_on[node].remove((expected_end, job_id, cores))
        entry = (expected_end, job_id, node, cores)
        i = bisect.bisect_left(self._ends, entry)
        assert self._ends[i] == entry, "a job's hold is in both views"
        del self._ends[i]

    def _take(self, node: int, cpus: frozenset[int], give: bool = False) -> None:
        self._by_free[self._free[node]].discard(node)
        if give:
            self._allocated[node] -= cpus
            self._free[node] += len(cpus)
            self._free_total += len(cpus)
        else:
            self._allocated[node] |= cpus
            self._free[node] -= len(cpus)
            self._free_total -= len(cpus)
        self._by_free[self._free[node]].add(node)

    def _start(self, job: SimJob, placement: dict[int, int], now: float) -> None:
        nodes = tuple(sorted(placement))
        allocation = []
        for node in nodes:
            alloc = frozenset(sorted(self._cpus - self._allocated[node])[: placement[node]])
            self._take(node, alloc)
            allocation.append(alloc)
        r = _Running(job, nodes, tuple(allocation), list(allocation), job.work, now,
                     now + job.startup_s, now + job.expected_s,
                     known=[{} for _ in nodes], offers=[None] * len(nodes),
                     caps=[None] * len(nodes), index={n: i for i, n in enumerate(nodes)},
                     ranks=(1,) if len(nodes) == 1 else tuple(placement[n] for n in nodes))
        self._running[job.job_id] = r
        for node in nodes:
            self._on_node[node].add(job.job_id)
            self._hold(node, r.expected_end, job.job_id, placement[node])
        self._starts[job.job_id] = now
        if self.time_limits is TimeLimits.ENFORCED:
            self._push(r.expected_end, 4, job.job_id)
        self._dirty.update(nodes)
        self._touched.add(job.job_id)
        if self.policy is SimPolicy.NODES:
            if self._node_malleable(r):
                self._node_jobs.add(job.job_id)
            self._regain(r, now)
            self._reenter_releasable(r)

    def _finish(self, r: _Running, now: float, *, timed_out: bool = False) -> None:
        self._settle(r, now)
        del self._running[r.job.job_id]
        self._gain_stamp.pop(r.job.job_id, None)
        self._node_jobs.discard(r.job.job_id)
        self._release_entries.pop(r.job.job_id, None)
        for node, alloc in zip(r.nodes, r.allocation):
            self._on_node[node].discard(r.job.job_id)
            self._unhold(node, r.expected_end, r.job.job_id, len(alloc))
            self._take(node, alloc, give=True)
        self._dirty.update(r.nodes)
        self._touched.discard(r.job.job_id)
        self._results.append(JobResult(r.job.job_id, r.job.submit_s, self._starts[r.job.job_id],
                                       now, r.job.cores, r.job.spec is not None, len(r.nodes),
                                       r.job.reference_s, timed_out))

    # --- node-count malleability (the nodes regime) ------------------------------------------

    def _node_malleable(self, r: _Running) -> bool:
        """A malleable job that holds at least a node's worth of cores: Slurm's NumNodes
        applies to it (a job within a node is left to the agents' regimes)."""
        return r.job.spec is not None and r.job.cores >= self.cores

    def _releasable(self) -> list[tuple[tuple, int, int]]:
        """(order, job, node) for every whole node a running job could give back now, in the
        order they are given: grown jobs first (most nodes beyond what they asked for), then
        the jobs with the most nodes above their floor; a job's highest node first."""
        out = [entry for entries in self._release_entries.values() for entry in entries]
        out.sort()
        return out

    def _reenter_releasable(self, r: _Running) -> None:
        """The job's nodes changed (or it started): the whole nodes it could give back, kept
        between events (``_releasable`` runs at every event where the first job is blocked)."""
        job_id = r.job.job_id
        self._release_entries.pop(job_id, None)
        if job_id not in self._node_jobs:
            return
        asked = r.job.fewest_nodes(self.cores)
        spare = len(r.nodes) - self.node_bounds.fewest(asked)
        whole = [n for n, a in zip(r.nodes, r.allocation) if len(a) == self.cores]
        entries = [((-(len(r.nodes) - asked - k), -(spare - k), job_id, -node), job_id, node)
                   for k, node in enumerate(sorted(whole, reverse=True)[:max(0, spare)])]
        if entries:
            self._release_entries[job_id] = entries

    def _shrink_for_head(self, now: float) -> None:
        """The main scheduler, where the first queued job does not fit: it gets whole nodes of
        running malleable jobs if that many make it fit (else none are taken) and starts; so
        on until the first job cannot start."""
        while self._queue:
            head = self._queue.first()
            if self._fits_now(head):     # the main scheduler's turn: it fits as things are
                self._start(self._queue.pop(), self._place(head), now)
                continue
            releasable = self._releasable()
            if head.cores <= self.cores:
                take = 1
            else:
                take = -(-(head.cores - self._free_total) // self.cores)
            if len(releasable) < take:
                return
            for _, job_id, node in releasable[:take]:
                self._move_node(self._running[job_id], node, now, add=False)
            placement = self._place(head)
            assert placement is not None, "whole idle nodes hold the head"
            self._start(self._queue.pop(), placement, now)

    def _gain(self, r: _Running) -> float | None:
        """What a whole node more adds to the job's rate, if it may grow (below ``grow_to``
        times its nodes) and that is at least ``min_gain`` of the average worth of its cores
        now; else None."""
        bounds = self.node_bounds
        if len(r.nodes) >= bounds.most(r.job.fewest_nodes(self.cores)):
            return None
        width = sum(len(a) for a in r.allocation)
        now_rate = r.job.speedup.rate(width)
        more = r.job.speedup.rate(width + self.cores) - now_rate
        return more if more >= bounds.min_gain * self.cores * now_rate / width else None

    def _regain(self, r: _Running, now: float) -> None:
        """The job's nodes changed (or it started, or its hold-off ended): its entry among the
        growth candidates, none while it may not grow."""
        job_id = r.job.job_id
        self._gain_stamp.pop(job_id, None)
        if now < r.no_grow_until:
            return
        if not self._node_malleable(r) or (g := self._gain(r)) is None:
            return
        self._stamps += 1
        self._gain_stamp[job_id] = self._stamps
        heapq.heappush(self._gain_heap, (-g, job_id, self._stamps))

    def _best_candidate(self) -> int | None:
        """The running job that gains the most from a node more (ties: the lowest id)."""
        heap = self._gain_heap
        while heap and self._gain_stamp.get(heap[0][1]) != heap[0][2]:
            heapq.heappop(heap)     # stale: the job's nodes changed since, or it ended
        return heap[0][1] if heap else None

    def _grow_into_idle(self, now: float) -> None:
        """Each wholly idle node to the malleable job whose rate gains the most from it (at
        least ``min_gain`` of the average worth of its cores now), one node at a time. The
        candidates are kept between events (``_regain``), not weighed again at each."""
        if not self._by_free[self.cores] or self._best_candidate() is None:
            return
        for node in sorted(self._by_free[self.cores]):
            job_id = self._best_candidate()
            if job_id is None:
                return
            self._move_node(self._running[job_id], node, now, add=True)   # re-enters it

    def _move_node(self, r: _Running, node: int, now: float, *, add: bool) -> None:
        """Give the job all the cores of an idle node, or take back one of its whole nodes:
        Slurm's allocation changes (its expected end does not), and it runs at its new width
        from now on."""
        self._settle(r, now)
        job_id = r.job.job_id
        if add:
            cpus = frozenset(self._cpus)
            self._take(node, cpus)
            placed = dict(zip(r.nodes, r.allocation)) | {node: cpus}
            self._on_node[node].add(job_id)
            self._hold(node, r.expected_end, job_id, self.cores)
        else:
            placed = dict(zip(r.nodes, r.allocation))
            self._take(node, placed.pop(node), give=True)
            self._on_node[node].discard(job_id)
            self._unhold(node, r.expected_end, job_id, self.cores)
            hold = self.node_bounds.regrow_after_s
            if hold > 0:
                r.no_grow_until = now + hold
                self._push(r.no_grow_until, 5, job_id)
        r.nodes = tuple(sorted(placed))
        r.allocation = tuple(placed[n] for n in r.nodes)
        r.current = list(r.allocation)
        r.index = {n: i for i, n in enumerate(r.nodes)}
        r.ranks = tuple(len(a) for a in r.allocation)
        r.known = [{} for _ in r.nodes]
        r.offers, r.caps = [None] * len(r.nodes), [None] * len(r.nodes)
        if r.rate > 0.0:
            self.resizes += 1
        self._pause(r, now, self.resize_costs.node_s)
        self._touched.add(job_id)
        self._regain(r, now)
        self._reenter_releasable(r)

    def _pause(self, r: _Running, now: float, seconds: float) -> None:
        """A resize's cost: the job does no work for ``seconds`` from now (its cores held)."""
        if seconds <= 0.0 or now + seconds <= r.ready_at:
            return
        self.paused_core_s += sum(len(c) for c in r.current) * (now + seconds -
                                                                max(now, r.ready_at))
        r.ready_at = now + seconds

    # --- the nodes' agents ------------------------------------------------------------------

    def _settle_agents(self, now: float) -> None:
        """Every node where a job started or ended plans again (the agent's decide), then the
        nodes of multi-node jobs whose peer cap moved; each job whose cores changed then runs
        at its new rate."""
        if self.policy.agent_policy is not None:
            pending = sorted(self._dirty)
            for _ in range(PEER_ROUNDS):
                moved: set[int] = set()      # multi-node jobs whose offers changed
                for node in pending:
                    moved |= self._replan(node, now)
                pending = sorted({node for jid in moved for i, node in
                                  enumerate(self._running[jid].nodes)
                                  if peer_cap(self._running[jid].offers, i)
                                  != self._running[jid].caps[i]})
                if not pending:
                    break
        self._dirty.clear()
        for job_id in sorted(self._touched):
            self._rerate(self._running[job_id], now)
        self._touched.clear()

    def _replan(self, node: int, now: float) -> set[int]:
        """The node's agent: decide on a snapshot of its jobs (their ranks here, see
        ``_Running.ranks``; one rank view stands for them all, its steps/s by the node's
        cores as JobView counts them), each multi-node malleable job capped by its other nodes'
        offers per rank. Returns the jobs whose offer here changed."""
        running = [self._running[j] for j in sorted(self._on_node[node])]
        if not running:
            return set()
        views, where = [], []
        for r in running:
            i = r.index[node]
            where.append(i)
            if len(r.nodes) > 1 and r.job.spec is not None:
                r.caps[i] = peer_cap(r.offers, i)
            view = r.views.get(i)
            if view is None or not (view.current is r.current[i]
                                    and view.allocation is r.allocation[i]
                                    and view.ranks[0].steps_per_s is r.known[i]
                                    and view.peer_cap_per_rank == r.caps[i]
                                    and view.nodes == len(r.nodes)
                                    and view.ranks[0].local_size == r.ranks[i]):
                view = r.views[i] = JobView(
                    job_id=r.job.job_id, uid=1000, user="sim", allocation=r.allocation[i],
                    current=r.current[i], spec=r.job.spec, nodes=len(r.nodes),
                    peer_cap_per_rank=r.caps[i],
                    ranks=(RankView(pid=1, rank=i, local_rank=0, local_size=r.ranks[i],
                                    intra_active=len(r.current[i]) // r.ranks[i],
                                    steps_per_s=r.known[i]),))
            views.append(view)
        self.decide_calls += 1
        plan = decide(NodeSnapshot(node=f"n{node}", cpus=self._cpus, jobs=tuple(views)),
                      self.policy.agent_policy)
        moved = set()
        targets, offers = plan.targets, plan.offers
        for r, i in zip(running, where):
            job_id, now_held = r.job.job_id, r.current[i]
            target = targets[job_id]
            if target is not now_held and target != now_held:   # mostly passed on as it was
                self._settle(r, now)
                if r.rate > 0.0:
                    self.resizes += 1
                r.current[i] = target
                self._pause(r, now, self.resize_costs.core_s)
                self._touched.add(job_id)
            if len(r.nodes) > 1 and offers.get(job_id) != r.offers[i]:
                r.offers[i] = offers.get(job_id)
                moved.add(job_id)
        return moved

    def _rerate(self, r: _Running, now: float) -> None:
        self._settle(r, now)
        r.cores_used, width = r.usage(self.policy is SimPolicy.CGROUP_ONLY)
        if self.policy is SimPolicy.NODES:    # every core of its nodes, however many
            r.cores_used = width = sum(len(a) for a in r.allocation)
        elif r.multi_node:  # no wider than its fewest nodes, each at its per-node maximum
            width = min(width, r.job.max_cores(self.cores))
        r.rate = r.job.speedup.rate(width)
        for i, cpus in enumerate(r.current):
            r.known[i][len(cpus)] = r.rate    # what its ranks measure: the job's pace
        r.version += 1
        self._push(max(now, r.ready_at) + r.remaining / r.rate, 0, (r.job.job_id, r.version))

    def _settle(self, r: _Running, now: float) -> None:
        dt = now - max(r.since, r.ready_at)    # no work is done while the job starts up
        if dt > 0 and r.rate > 0:
            r.remaining = max(0.0, r.remaining - r.rate * dt)
            self._busy_core_s += r.cores_used * dt
        r.since = now

    # --- results ----------------------------------------------------------------------------

    def _widths(self) -> Callable[[SimJob], tuple[int, int]] | None:
        """Under the nodes regime, a node-malleable job's widths for the bound: from its
        fewest whole nodes to its most (None: each job's own)."""
        if self.policy is not SimPolicy.NODES:
            return None
        bounds = self.node_bounds

        def widths(j: SimJob) -> tuple[int, int]:
            if j.spec is None or j.cores < self.cores:
                return j.min_cores(self.cores), j.max_cores(self.cores)
            asked = j.fewest_nodes(self.cores)
            return (min(j.cores, bounds.fewest(asked) * self.cores),
                    max(j.cores, min(self.nodes, bounds.most(asked)) * self.cores))
        return widths

    def _result(self, wall_s: float) -> SimResult:
        res = sorted(self._results, key=lambda r: r.job_id)
        first = min(r.submit_s for r in res)
        makespan = max(r.end_s for r in res) - first
        response = [r.counted_response_s for r in res]     # a killed job's rerun counted
        wait = [r.wait_s for r in res]
        return SimResult(
            policy=self.policy.value, nodes=self.nodes, cores=self.cores, jobs=len(res),
            malleable_jobs=sum(r.malleable for r in res), core_seconds=self._busy_core_s,
            makespan_s=makespan,
            lower_bound_makespan_s=fluid_lower_bound(self.jobs, self.nodes, self.cores,
                                                     widths=self._widths()),
            mean_response_s=sum(response) / len(res), p95_response_s=percentile(response, 95),
            mean_wait_s=sum(wait) / len(res), p95_wait_s=percentile(wait, 95),
            mean_bounded_slowdown=sum(bounded_slowdown(r.counted_response_s, r.reference_s)
                                      for r in res) / len(res),
            utilisation=(self._busy_core_s / (self.nodes * self.cores * makespan)
                         if makespan else 0.0),
            queue_order=self._queue.order.value, backfill=self.backfill.value,
            resizes=self.resizes, decide_calls=self.decide_calls, wall_s=wall_s,
            per_job=tuple(res), paused_core_s=self.paused_core_s,
            node_resize_cost_s=self.resize_costs.node_s,
            core_move_cost_s=self.resize_costs.core_s, time_limits=self.time_limits.value,
            timed_out_jobs=sum(r.timed_out for r in res))


def simulate(jobs: Sequence[SimJob], *, nodes: int, cores: int, policy: SimPolicy,
             backfill: Backfill = Backfill.CONSERVATIVE, backfill_depth: int = 500,
             backfill_interval_s: float = 30.0,
             queue_order: QueueOrder = QueueOrder.FCFS,
             node_bounds: NodeBounds = NodeBounds(),
             placement: Placement = Placement.SLURM_TASKS, backfill_phase_s: float = 0.0,
             batch_sched_delay_s: float = 3.0,
             backfill_window_s: float = BF_WINDOW_S,
             resize_costs: ResizeCosts = ResizeCosts(),
             time_limits: TimeLimits = TimeLimits.IGNORED,
             slurm_pass: SlurmPass | None = None) -> SimResult:
    return Simulation(jobs, nodes=nodes, cores=cores, policy=policy, backfill=backfill,
                      backfill_depth=backfill_depth, backfill_interval_s=backfill_interval_s,
                      queue_order=queue_order, node_bounds=node_bounds,
                      placement=placement, backfill_phase_s=backfill_phase_s,
                      batch_sched_delay_s=batch_sched_delay_s,
                      backfill_window_s=backfill_window_s, resize_costs=resize_costs,
                      time_limits=time_limits, slurm_pass=slurm_pass).run()
