"""A discrete-event simulation of a cluster whose nodes run the co-scheduler's own policy.

Slurm's part is a stand-in for its two schedulers. The main one runs at every arrival and end:
queued jobs start in queue order (``QueueOrder``: first come, first served unless a site sets a
priority), each wherever its allocation fits Slurm's view of a node (best fit: the node with the
fewest free cores that holds it), until the first that does not fit. The backfill pass runs every ``backfill_interval_s`` (Slurm's bf_interval) while jobs
wait: the first job that does not fit gets a reservation, the node and time at which it will
fit by the running jobs' expected ends (start + start-up + runtime at the allocation: what a
time limit tells Slurm; a job that grew ends sooner), and the next ``backfill_depth`` jobs start
where they cannot delay it (EASY backfill). Without the reservation wide jobs starve behind a
stream of narrow ones, in every regime alike. Slurm never sees lent cores: an allocation is
taken from cores no running job was allocated. The node's part is the agent's: on every node
where a job started or ended, ``coscheduler.policy.decide`` (the same function the agent runs,
invariants checked) is given a NodeSnapshot with each job's allocation, its current cores and
the steps/s it has shown (each core count a job has run at is known exactly once it ran there:
the telemetry), and each job then holds the cores of the plan. A job first spends its
``startup_s`` (launch, imports, building the model: measured, and no shorter on more cores),
then progresses at its speedup curve's rate for the cores its threads use:

    static        Slurm's allocation (the agent does nothing; decide is not called)
    lend-idle     decide(LEND_IDLE): the cores of the plan
    throughput    decide(THROUGHPUT): the cores of the plan
    cgroup-only   decide(LEND_IDLE) moves the cgroups, but the threads stay as many as at start
                  (what `docker update` or a cpuset-only agent gives): rate at
                  min(cores held, allocation)
"""
from __future__ import annotations

import bisect
import enum
import heapq
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..coscheduler.model import JobView, NodeSnapshot, Policy, RankView
from ..coscheduler.policy import decide
from .workload import SimJob, ask_share, fluid_lower_bound


class SimPolicy(enum.Enum):
    STATIC = "static"
    LEND_IDLE = "lend-idle"
    THROUGHPUT = "throughput"
    CGROUP_ONLY = "cgroup-only"

    @property
    def threads_follow(self) -> bool:
        """Whether a job's threads grow with its cores (so it may ask Slurm for less)."""
        return self in (SimPolicy.LEND_IDLE, SimPolicy.THROUGHPUT)

    def submitted(self, jobs: Sequence[SimJob], malleable_ask: float) -> list[SimJob]:
        """The jobs as this regime's users submit them: where threads follow the cores, each
        malleable job asks Slurm for ``malleable_ask`` of its cores and grows from there; under
        static and cgroup-only every job asks for its size, as plain TensorFlow users do."""
        return ask_share(jobs, malleable_ask) if self.threads_follow else list(jobs)

    @property
    def agent_policy(self) -> Policy | None:
        return {SimPolicy.STATIC: None, SimPolicy.LEND_IDLE: Policy.LEND_IDLE,
                SimPolicy.THROUGHPUT: Policy.THROUGHPUT,
                SimPolicy.CGROUP_ONLY: Policy.LEND_IDLE}[self]


class QueueOrder(enum.Enum):
    """The order of Slurm's queue (its priority), the same in every regime.

    fcfs           submission order: Slurm's default (priority/basic, or multifactor's age)
    widest-first   the most cores first: multifactor's job-size factor with large jobs favoured
                   (PriorityFavorSmall=NO), a common site setting
    longest-first  the longest time limit first (start + start-up + runtime at the allocation):
                   what a site could set from the time limit; longest-processing-time-first
                   is the classic order for a short makespan
    """

    FCFS = "fcfs"
    WIDEST_FIRST = "widest-first"
    LONGEST_FIRST = "longest-first"

    def key(self, job: SimJob) -> tuple:
        """Smaller is served first; submission order breaks ties."""
        tie = (job.submit_s, job.job_id)
        if self is QueueOrder.WIDEST_FIRST:
            return (-job.cores, *tie)
        if self is QueueOrder.LONGEST_FIRST:
            return (-job.expected_s, *tie)
        return tie


class _Queue:
    """Slurm's pending jobs in priority order (a heap: pop the first, push back)."""

    def __init__(self, order: QueueOrder):
        self.order = order
        self._heap: list[tuple[tuple, SimJob]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def first(self) -> SimJob:
        return self._heap[0][1]

    def push(self, job: SimJob) -> None:
        heapq.heappush(self._heap, (self.order.key(job), job))

    def pop(self) -> SimJob:
        return heapq.heappop(self._heap)[1]


@dataclass
class _Running:
    job: SimJob
    node: int
    allocation: frozenset[int]
    current: frozenset[int]
    remaining: float          # work units left
    since: float              # when remaining was last brought up to date
    ready_at: float           # start-up over: work begins
    expected_end: float       # Slurm's view: start + start-up + runtime at the allocation
    rate: float = 0.0
    cores_used: int = 0       # cores the job's threads use now
    version: int = 0          # bumps on each rate change: older completion events are stale
    known: dict[int, float] = field(default_factory=dict)   # steps/s by cores, as measured


@dataclass
class _Reservation:
    """EASY backfill's one reservation, for the first job that does not fit: on ``node`` from
    ``start``, with ``spare`` cores beyond it there then. A job may start on that node now only
    if it is expected to end by ``start`` or fits in the spare cores (which it then uses up)."""

    node: int
    start: float
    spare: int

    def allows(self, node: int, cores: int, expected_end: float) -> bool:
        return node != self.node or expected_end <= self.start or cores <= self.spare

    def book(self, node: int, cores: int, expected_end: float) -> None:
        """A job started on ``node``: if it still runs at ``start``, it takes spare cores."""
        if node == self.node and expected_end > self.start:
            self.spare -= cores


@dataclass(frozen=True)
class JobResult:
    job_id: int
    submit_s: float
    start_s: float
    end_s: float
    cores: int
    malleable: bool


@dataclass(frozen=True)
class SimResult:
    policy: str
    nodes: int
    cores: int
    jobs: int
    malleable_jobs: int
    makespan_s: float
    mean_completion_s: float   # from submit to end (turnaround), the mean over jobs
    mean_wait_s: float
    utilisation: float         # core-seconds the jobs' threads used / (cores x makespan)
    lower_bound_makespan_s: float
    queue_order: str
    resizes: int               # changes of a running job's cores
    decide_calls: int
    wall_s: float
    per_job: tuple[JobResult, ...] = ()

    def summary(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "per_job"}


class Simulation:
    """One run. ``clock`` only measures wall_s (injected for tests)."""

    def __init__(self, jobs: Sequence[SimJob], *, nodes: int, cores: int, policy: SimPolicy,
                 backfill_depth: int = 100, backfill_interval_s: float = 30.0,
                 queue_order: QueueOrder = QueueOrder.FCFS,
                 clock: Callable[[], float] = time.perf_counter):
        for j in jobs:
            if not 1 <= j.cores <= cores:
                raise ValueError(f"job {j.job_id} asks for {j.cores} cores; nodes have {cores}")
        self.jobs = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
        self.nodes, self.cores, self.policy = nodes, cores, policy
        self.backfill_depth = backfill_depth
        self.backfill_interval_s = backfill_interval_s
        self._backfill_due = False     # a backfill pass is queued
        self._clock = clock
        self._cpus = frozenset(range(cores))
        self._running: dict[int, _Running] = {}
        self._on_node: list[set[int]] = [set() for _ in range(nodes)]
        self._allocated: list[set[int]] = [set() for _ in range(nodes)]
        # Nodes by free cores (Slurm's view): best fit is the first non-empty bucket >= need.
        self._by_free: list[set[int]] = [set() for _ in range(cores + 1)]
        self._by_free[cores] = set(range(nodes))
        # Per node, (expected end, job, cores) of its running jobs, sorted: the reservation.
        self._ends_on: list[list[tuple[float, int, int]]] = [[] for _ in range(nodes)]
        self._events: list[tuple] = []
        self._seq = 0
        self._queue = _Queue(queue_order)
        self._starts: dict[int, float] = {}
        self._results: list[JobResult] = []
        self._busy_core_s = 0.0
        self.resizes = 0
        self.decide_calls = 0

    # --- the event loop ---------------------------------------------------------------------

    def _push(self, t: float, kind: int, payload) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, payload))

    def run(self) -> SimResult:
        t0 = self._clock()
        for j in self.jobs:
            self._push(j.submit_s, 1, j)
        now = 0.0
        while self._events:
            now, kind, _, payload = heapq.heappop(self._events)
            backfill = False
            if kind == 0:                          # an end (ends first at equal times)
                job_id, version = payload
                r = self._running.get(job_id)
                if r is None or r.version != version:
                    continue                       # stale: its rate changed since
                self._finish(r, now)
            elif kind == 1:
                self._queue.push(payload)
            else:                                  # the periodic backfill pass
                self._backfill_due = False
                backfill = True
            if self._events and self._events[0][0] == now and not backfill:
                continue                           # settle every event of this instant first
            self._schedule(now, backfill=backfill)
            if self._queue and not self._backfill_due:
                self._backfill_due = True
                self._push(now + self.backfill_interval_s, 2, None)
        if self._queue or self._running:
            raise RuntimeError(f"{len(self._queue)} jobs never started, "
                               f"{len(self._running)} never ended")
        return self._result(self._clock() - t0)

    def _schedule(self, now: float, *, backfill: bool = False) -> None:
        dirty: set[int] = set()
        while self._queue and self._queue.first().cores <= self._max_free():   # main scheduler
            job = self._queue.pop()
            node = self._best_fit(job.cores)
            self._start(job, node, now)
            dirty.add(node)
        if backfill and self._queue:
            head = self._queue.pop()
            reservation = self._reserve(head.cores, now)
            window = [self._queue.pop()
                      for _ in range(min(self.backfill_depth, len(self._queue)))]
            waiting = []
            for job in window:
                end = now + job.expected_s
                node = self._best_fit(job.cores, reservation, end)
                if node is None:
                    waiting.append(job)
                    continue
                reservation.book(node, job.cores, end)
                self._start(job, node, now)
                dirty.add(node)
            for job in (head, *waiting):
                self._queue.push(job)
        for node in sorted(dirty):
            self._replan(node, now)

    # --- Slurm's view -----------------------------------------------------------------------

    def _free(self, node: int) -> int:
        return self.cores - len(self._allocated[node])

    def _max_free(self) -> int:
        for free in range(self.cores, 0, -1):
            if self._by_free[free]:
                return free
        return 0

    def _best_fit(self, need: int, reservation: _Reservation | None = None,
                  expected_end: float = 0.0) -> int | None:
        """The node with the fewest free cores that still holds ``need`` and where a job
        expected to end at ``expected_end`` cannot delay the reservation (deterministic: the
        buckets are sets of ints, iterated in the order CPython keeps them); None if none."""
        for free in range(need, self.cores + 1):
            for node in self._by_free[free]:
                if reservation is None or reservation.allows(node, need, expected_end):
                    return node
        return None

    def _reserve(self, need: int, now: float) -> _Reservation:
        """Where and when a job of ``need`` cores will fit by the running jobs' expected ends:
        the earliest node, and how many cores that node has spare then beyond ``need``."""
        best: tuple[float, int, int] | None = None   # (time, node, spare cores then)
        for node in range(self.nodes):
            free = self._free(node)
            at = now
            for end, _, cores in self._ends_on[node]:
                if free >= need or (best is not None and end >= best[0]):
                    break
                free += cores
                at = max(now, end)
            if free >= need and (best is None or at < best[0]):
                best = (at, node, free - need)
        assert best is not None, "every job fits an empty node"
        return _Reservation(node=best[1], start=best[0], spare=best[2])

    def _take(self, node: int, cpus: frozenset[int], give: bool = False) -> None:
        self._by_free[self._free(node)].discard(node)
        if give:
            self._allocated[node] -= cpus
        else:
            self._allocated[node] |= cpus
        self._by_free[self._free(node)].add(node)

    def _start(self, job: SimJob, node: int, now: float) -> None:
        alloc = frozenset(sorted(self._cpus - self._allocated[node])[: job.cores])
        self._take(node, alloc)
        r = _Running(job, node, alloc, alloc, job.work, now, now + job.startup_s,
                     now + job.expected_s)
        self._running[job.job_id] = r
        self._on_node[node].add(job.job_id)
        bisect.insort(self._ends_on[node], (r.expected_end, job.job_id, job.cores))
        self._starts[job.job_id] = now
        if self.policy.agent_policy is None:
            self._set_cores(r, alloc, now)   # static: nothing else will ever move it

    def _finish(self, r: _Running, now: float) -> None:
        self._settle(r, now)
        del self._running[r.job.job_id]
        self._on_node[r.node].discard(r.job.job_id)
        self._ends_on[r.node].remove((r.expected_end, r.job.job_id, r.job.cores))
        self._take(r.node, r.allocation, give=True)
        self._results.append(JobResult(r.job.job_id, r.job.submit_s, self._starts[r.job.job_id],
                                       now, r.job.cores, r.job.spec is not None))
        self._replan(r.node, now)

    # --- the node's agent -------------------------------------------------------------------

    def _replan(self, node: int, now: float) -> None:
        running = [self._running[j] for j in sorted(self._on_node[node])]
        policy = self.policy.agent_policy
        if policy is None or not running:
            return   # static: every job got its allocation when it started
        snapshot = NodeSnapshot(node=f"n{node}", cpus=self._cpus, jobs=tuple(
            JobView(job_id=r.job.job_id, uid=1000, user="sim", allocation=r.allocation,
                    current=r.current, spec=r.job.spec,
                    ranks=(RankView(pid=1, rank=0, local_rank=0, local_size=1,
                                    intra_active=len(r.current), steps_per_s=dict(r.known)),))
            for r in running))
        self.decide_calls += 1
        plan = decide(snapshot, policy)
        for r in running:
            target = plan.targets[r.job.job_id]
            if target != r.current or r.rate == 0.0:
                self._set_cores(r, target, now)

    def _set_cores(self, r: _Running, cpus: frozenset[int], now: float) -> None:
        self._settle(r, now)
        if r.rate > 0.0 and cpus != r.current:
            self.resizes += 1
        r.current = cpus
        used = len(cpus)
        if self.policy is SimPolicy.CGROUP_ONLY:
            used = min(used, len(r.allocation))   # the threads never grew past their start
        r.cores_used = used
        r.rate = r.job.speedup.rate(used)
        r.known[len(cpus)] = r.rate
        r.version += 1
        self._push(max(now, r.ready_at) + r.remaining / r.rate, 0, (r.job.job_id, r.version))

    def _settle(self, r: _Running, now: float) -> None:
        dt = now - max(r.since, r.ready_at)    # no work is done while the job starts up
        if dt > 0 and r.rate > 0:
            r.remaining = max(0.0, r.remaining - r.rate * dt)
            self._busy_core_s += r.cores_used * dt
        r.since = now

    # --- results ----------------------------------------------------------------------------

    def _result(self, wall_s: float) -> SimResult:
        res = sorted(self._results, key=lambda r: r.job_id)
        first = min(r.submit_s for r in res)
        makespan = max(r.end_s for r in res) - first
        return SimResult(
            policy=self.policy.value, nodes=self.nodes, cores=self.cores, jobs=len(res),
            malleable_jobs=sum(r.malleable for r in res), makespan_s=makespan,
            mean_completion_s=sum(r.end_s - r.submit_s for r in res) / len(res),
            mean_wait_s=sum(r.start_s - r.submit_s for r in res) / len(res),
            utilisation=(self._busy_core_s / (self.nodes * self.cores * makespan)
                         if makespan else 0.0),
            lower_bound_makespan_s=fluid_lower_bound(self.jobs, self.nodes, self.cores),
            queue_order=self._queue.order.value,
            resizes=self.resizes, decide_calls=self.decide_calls, wall_s=wall_s,
            per_job=tuple(res))


def simulate(jobs: Sequence[SimJob], *, nodes: int, cores: int, policy: SimPolicy,
             backfill_depth: int = 100, backfill_interval_s: float = 30.0,
             queue_order: QueueOrder = QueueOrder.FCFS) -> SimResult:
    return Simulation(jobs, nodes=nodes, cores=cores, policy=policy,
                      backfill_depth=backfill_depth, backfill_interval_s=backfill_interval_s,
                      queue_order=queue_order).run()
