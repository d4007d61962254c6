"""A discrete-event simulation of a cluster whose nodes run the co-scheduler's own policy.

Slurm's part is a stand-in for its two schedulers. The main one runs for arrivals and ends
(when, below): queued jobs start in queue order (``QueueOrder``: first come, first served unless
a site sets a priority) until the first that does not fit. Where a job goes is
select/cons_tres's choice as this stand-in has it: a job that fits a node gets the node with the
fewest free cores that holds it (best fit), and where none holds it now it is spread over
several as ``sbatch -n P`` is (``Placement.SLURM_TASKS``, the default) or waits for one
(``Placement.ONE_NODE``, below); a wider one takes whole idle nodes, lowest-numbered first, and
the rest on the node that holds it most tightly, else on the nodes with the most free cores
(``select_nodes``): Slurm packs a job's CPUs onto its nodes, it does not spread them evenly. The
two schedulers run when slurmctld runs them: the main one for a batch job's arrival or an end at
most once every ``batch_sched_delay_s`` (slurmctld's background loop calls schedule() only when
that long has passed since its last call, 3 s by default), the backfill pass on a fixed cadence,
at ``backfill_phase_s + k * backfill_interval_s`` (Slurm's bf_interval; its thread sleeps that
long between passes whatever the queue does), while jobs wait, over the first ``backfill_depth``
queued jobs (bf_max_job_test), planning with the running jobs' expected ends (start + time
limit: a log's requested time, else start-up + runtime at the allocation; a job that grew ends
sooner): conservatively, as Slurm does (each job that cannot start now is reserved where it fits
earliest, if that is within ``backfill_window_s``, Slurm's bf_window, and no job after it may
delay it), or EASY (only the first is reserved), see ``Backfill``. Slurm never sees lent
cores: an allocation is taken from cores no running job was allocated.

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
import enum
import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy

from malleable_policy.model import JobView, NodeSnapshot, Policy, RankView
from malleable_policy.decide import decide
from .metrics import bounded_slowdown, percentile
from .workload import SimJob, ask_share, fluid_lower_bound


class SimPolicy(enum.Enum):
    """The regimes, in the order they are reported: the baselines first."""

    STATIC = "static"
    STATIC_ASK = "static-ask"
    CGROUP_ONLY = "cgroup-only"
    LEND_IDLE = "lend-idle"
    THROUGHPUT = "throughput"
    NODES = "nodes"

    @property
    def threads_follow(self) -> bool:
        """Whether a job's threads grow with its cores."""
        return self in (SimPolicy.LEND_IDLE, SimPolicy.THROUGHPUT)

    @property
    def asks_less(self) -> bool:
        """Whether malleable jobs ask Slurm for ``malleable_ask`` of their size."""
        return self.threads_follow or self is SimPolicy.STATIC_ASK

    def submitted(self, jobs: Sequence[SimJob], malleable_ask: float,
                  node_cores: int) -> list[SimJob]:
        """The jobs as this regime's users submit them: each malleable job asking Slurm for
        ``malleable_ask`` of its cores (``ask_share``) where the regime asks less; under static
        and cgroup-only every job asks for its size, as plain TensorFlow users do."""
        return ask_share(jobs, malleable_ask, node_cores) if self.asks_less else list(jobs)

    @property
    def same_asks_baseline(self) -> "SimPolicy | None":
        """The regime without an agent whose jobs ask Slurm for the same: against it, what
        this regime's agent does on its own shows (None: no agent runs). Node-count
        malleability's own effect is against static: its jobs ask for their size."""
        if self is SimPolicy.NODES:
            return SimPolicy.STATIC
        if self.agent_policy is None:
            return None
        return SimPolicy.STATIC_ASK if self.asks_less else SimPolicy.STATIC

    @property
    def agent_policy(self) -> Policy | None:
        return {SimPolicy.STATIC: None, SimPolicy.STATIC_ASK: None,
                SimPolicy.CGROUP_ONLY: Policy.LEND_IDLE, SimPolicy.LEND_IDLE: Policy.LEND_IDLE,
                SimPolicy.THROUGHPUT: Policy.THROUGHPUT, SimPolicy.NODES: None}[self]


@dataclass(frozen=True)
class NodeBounds:
    """How far the ``nodes`` regime moves a malleable job's node count: down to ``shrink_to``
    of the nodes it asked for (rounded up, at least 1), up to ``grow_to`` times them, and a
    whole node more only if its cores add at least ``min_gain`` of what each of the job's cores
    does now (its speedup curve: Downey's is flat beyond 2A - 1, so such a job never grows)."""

    shrink_to: float = 0.5
    grow_to: float = 2.0
    min_gain: float = 0.5

    def fewest(self, asked_nodes: int) -> int:
        return max(1, math.ceil(asked_nodes * self.shrink_to))

    def most(self, asked_nodes: int) -> int:
        return max(asked_nodes, int(asked_nodes * self.grow_to))


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


# Slurm's bf_window default (BACKFILL_WINDOW in sched/backfill: 24 h).
BF_WINDOW_S = 24 * 3600.0


class Backfill(enum.Enum):
    """Slurm's backfill pass (sched/backfill, every bf_interval), in two variants.

    conservative  Slurm's: the queued jobs are tested in queue order, up to bf_max_job_test;
                  each starts now if it fits without delaying a job tested before it, else it
                  is reserved at the earliest time it fits, and no job tested after it may
                  delay that. Like Slurm's node space map, a reservation holds its job's nodes
                  whole, for its time limit. A job that cannot start within bf_window (one day
                  by default) of the pass gets no reservation, as in Slurm ("starts too far in
                  the future to worry about"): jobs after it may take its place.
    easy          only the first job that does not fit is reserved (EASY backfill); the jobs
                  after it start where they cannot delay it, on the cores it leaves.
    """

    CONSERVATIVE = "conservative"
    EASY = "easy"


class Placement(enum.Enum):
    """Where a job that fits a node goes when no single node holds it now.

    one-node      it waits for one node that holds it (best fit): the stand-in's earlier
                  rule, and ``-N 1`` (or ``--ntasks-per-node=P``) in Slurm
    slurm-tasks   the default: what select/cons_tres (CR_Core) does with ``sbatch -n P``: one
                  node if one holds it (best fit), else its tasks spread over several nodes as
                  a job wider than a node is (``select_nodes``: the node with the most free
                  cores first, each giving all it has); it then runs as a multi-node job (a
                  rank per core). Replayed on real Slurm (benchmarks/slurm_replay.py) its start
                  times are nearer Slurm's than one-node's (median error 0.17 vs 0.45).
    Jobs wider than a node are placed alike under both.
    """

    ONE_NODE = "one-node"
    SLURM_TASKS = "slurm-tasks"


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


def select_nodes(usable: list[int], need: int, node_cores: int) -> dict[int, int] | None:
    """Slurm's choice of nodes for a job wider than a node (select/cons_tres, as this stand-in
    has it): whole idle nodes first, lowest-numbered first; what is left on the one node that
    holds it with the fewest cores to spare; else on the nodes with the most usable cores first.
    Each node gives all its cores but the last one, which gives the rest (cons_tres takes every
    available CPU of the nodes it picks until the job has its count). ``usable``: each node's
    cores the job may take. None if they are too few."""
    if sum(usable) < need:
        return None
    chosen: dict[int, int] = {}
    idle = -1       # the last idle node taken: they are taken lowest-numbered first
    while need >= node_cores:
        try:    # list.index: the nodes are scanned in C (1,002 of them in LLNL's Thunder)
            idle = usable.index(node_cores, idle + 1)
        except ValueError:
            break
        chosen[idle] = node_cores
        need -= node_cores
    if need == 0:
        return chosen
    # The node that holds the rest with the fewest cores to spare, lowest-numbered among
    # equals: the first node with the least free count from ``need`` up that some node has.
    for free in sorted(f for f in set(usable) if f >= need):
        try:
            node = usable.index(free, idle + 1 if free == node_cores else 0)
        except ValueError:
            continue        # every idle node is taken already
        chosen[node] = need
        return chosen
    for free, node in sorted((-f, n) for n, f in enumerate(usable) if f > 0 and n not in chosen):
        chosen[node] = min(-free, need)
        need -= chosen[node]
        if need == 0:
            break
    return chosen


def peer_cap(offers: Sequence[int | None], i: int) -> int | None:
    """The smallest per-rank offer of a job's other nodes (None if none has offered yet): what
    the agent's observer reads from the feed (``NodeObserver._peer_cap``), here from the offers
    the simulated agents made."""
    caps = [*offers[:i], *offers[i + 1:]]
    if None in caps:
        caps = [o for o in caps if o is not None]
    return min(caps) if caps else None


class _Profile:
    """One conservative backfill pass's view of the cluster: each node's free cores over time
    (Slurm's view now, and the cores of each running job back at its expected end) and the
    reservations made in this pass (whole nodes, for their jobs' time limits). Jobs started in
    the pass are in the simulation's own state; a node where one started is read again."""

    REMEMBERED = 16     # earlier searches kept for where a search may begin

    def __init__(self, free: Sequence[int], ends_on: Sequence[Sequence[tuple[float, int, int]]],
                 node_cores: int, now: float,
                 ends: Sequence[tuple[float, int, int, int]] | None = None):
        self._free, self._ends_on, self.node_cores, self.now = free, ends_on, node_cores, now
        # Every running job's (expected end, job, node, cores), sorted: the simulation keeps it
        # (read once, at the first wider search); else it is made from ends_on.
        self._ends = ends
        self.blocks: dict[int, list[tuple[float, float]]] = {}
        self._steps: dict[int, tuple[list[float], list[int]]] = {}
        # Per core count asked, the nodes by when they have that many free: built once per
        # pass, so a node where a job started since appears too early (it is read again).
        self._by_reach: dict[int, list[tuple[float, int, int]]] = {}
        self._changed: set[int] = set()
        # Every node's releases after now (for jobs wider than a node): times (None: to be
        # read again), cores, nodes.
        self._release_times: list[float] | None = None
        self._release_cores: list[int] = []
        self._release_nodes: list[int] = []
        self._free_now: list[int] = []
        self._total_now = 0
        # The reservations, numbered as made, as (start, number, node, end) and (end, number,
        # node), sorted.
        self._reservations = 0
        self._by_start: list[tuple[float, int, int, float]] = []
        # The same by number (the n-th made is at n - 1): start, end, node.
        self._res_start = numpy.zeros(64)
        self._res_end = numpy.zeros(64)
        self._res_node = numpy.zeros(64, numpy.int64)
        self._by_end: list[tuple[float, int, int]] = []
        # What the last searches for wider jobs found: (cores, length, earliest start).
        self._found: list[tuple[int, float, float]] = []
        # The searches that found no time up to their horizon: (cores, length, horizon).
        self._beyond: list[tuple[int, float, float]] = []
        # At each of those times: the releases up to it, each node's free cores, their sum
        # (until a job starts in the pass: its start changes them).
        self._released: dict[float, tuple[int, list[int], int]] = {}

    def steps(self, node: int) -> tuple[list[float], list[int]]:
        """The node's free cores from now on: (times, free), free non-decreasing."""
        if node not in self._steps:
            times, free = [self.now], [self._free[node]]
            for end, _, cores in self._ends_on[node]:
                if end <= times[-1]:
                    free[-1] += cores
                else:
                    times.append(end)
                    free.append(free[-1] + cores)
            self._steps[node] = (times, free)
        return self._steps[node]

    def free_at(self, node: int, t: float) -> int:
        times, free = self.steps(node)
        return free[bisect.bisect_right(times, t) - 1]

    def reach(self, node: int, need: int) -> float:
        """When the node first has ``need`` cores free (inf: never)."""
        times, free = self.steps(node)
        i = bisect.bisect_left(free, need)
        return times[i] if i < len(times) else float("inf")

    def clear_from(self, node: int, t: float, length: float) -> float:
        """The earliest start from ``t`` on whose window of ``length`` no reservation of this
        pass holds the node."""
        for start, end in self.blocks.get(node, ()):
            if end <= t:
                continue
            if start >= t + length:
                break
            t = end
        return t

    def earliest_on_one(self, need: int, length: float) -> tuple[float, int]:
        """The earliest time and the node a job of ``need`` cores (on one node) fits for
        ``length``; at the same time the node with the fewest free cores now (best fit)."""
        if need not in self._by_reach:
            self._by_reach[need] = sorted((self.reach(n, need), self._free[n], n)
                                          for n in range(len(self._free)))
        best_t, best_node = float("inf"), -1
        for reach, _, node in self._by_reach[need]:
            if reach >= best_t:
                break     # a node read again only reaches later: none below can beat best
            if node in self._changed:
                reach = self.reach(node, need)
            t = self.clear_from(node, reach, length) if node in self.blocks else reach
            if t < best_t:
                best_t, best_node = t, node
        assert best_node >= 0, "every job fits an empty node"
        return best_t, best_node

    def earliest_wide(self, need: int, length: float,
                      horizon: float = math.inf) -> tuple[float, dict[int, int]]:
        """The earliest time a job wider than a node fits for ``length`` on nodes no
        reservation holds then, and the nodes ``select_nodes`` picks from what is free then;
        (inf, {}) if that is after ``horizon`` (the search stops there).

        One sweep over the candidate times (now, each release, each reservation's end): a
        node is held at t while a reservation of this pass overlaps [t, t + length); each
        node's free cores and the held nodes' sum are kept as the sweep goes (releases add to
        a node, reservations enter by start and leave by end), so that each time costs its
        changes, not a pass over every node (1,002 nodes in LLNL's Thunder)."""
        if self._release_times is None:     # every node's releases after now, in time order
            ends = self._ends if self._ends is not None else \
                sorted((end, job, n, cores) for n, on in enumerate(self._ends_on)
                       for end, job, cores in on)
            # Free now in this view: a job past its expected end counts as ending now.
            past = bisect.bisect_right(ends, (self.now, math.inf))
            self._free_now = list(self._free)
            for _, _, n, cores in ends[:past]:
                self._free_now[n] += cores
            self._total_now = sum(self._free_now)
            later = ends[past:]
            self._release_times = [end for end, _, _, _ in later]
            self._release_cores = [cores for _, _, _, cores in later]
            self._release_nodes = [n for _, _, n, _ in later]
        # Nor does it fit before a horizon an earlier search for fewer cores and no longer
        # passed without a fit.
        if any(asked <= need and longest <= length and horizon <= passed
               for asked, longest, passed in self._beyond):
            return math.inf, {}
        rel_t, rel_c, rel_n = self._release_times, self._release_cores, self._release_nodes
        by_start, by_end = self._by_start, self._by_end
        n_released, n_start, n_end = len(rel_t), len(by_start), len(by_end)
        # Where the sweep may begin: the pass only takes cores away (a start holds its cores
        # until its expected end, a reservation holds its nodes), and a job that asks more
        # cores for longer fits no sooner, so no such job fits before what an earlier search
        # of this pass found for fewer cores and no longer (a time every search looks at).
        t = self.now
        for asked, longest, found in self._found:
            if found > t and asked <= need and longest <= length:
                t = found
        # The state at t without a check at each time before it: each node's free cores after
        # the releases up to t; the nodes held by the reservations overlapping [t, t + length).
        if t in self._released:         # as an earlier search left it at t
            k, cur, total = self._released[t]
            cur = list(cur)
        else:
            k = bisect.bisect_right(rel_t, t)
            cur = list(self._free_now)
            for j in range(k):
                cur[rel_n[j]] += rel_c[j]
            total = self._total_now + sum(rel_c[:k])
        # Per node, the reservations overlapping the window (a list); per reservation number,
        # whether it entered the window (a bytearray). Those at t are found in numpy: a pass on
        # Thunder makes thousands of node entries, one on the generated workload about 500.
        i_start = bisect.bisect_left(by_start, (t + length,))
        made = self._reservations
        inside = (self._res_start[:made] < t + length) & (self._res_end[:made] > t)
        count = numpy.bincount(self._res_node[:made][inside], minlength=len(cur))
        holds = count.tolist()
        held_nodes = numpy.flatnonzero(count).tolist()   # every node held in this search
        held_free = sum(map(cur.__getitem__, held_nodes))
        entered = bytearray(1) + inside.tobytes()
        i_end = bisect.bisect_right(by_end, (t, math.inf))
        inf = math.inf
        while True:
            while k < n_released and rel_t[k] <= t:
                node = rel_n[k]
                cur[node] += rel_c[k]
                total += rel_c[k]
                if holds[node]:
                    held_free += rel_c[k]
                k += 1
            while i_start < n_start and by_start[i_start][0] < t + length:
                _, rid, node, end = by_start[i_start]
                i_start += 1
                if end <= t:
                    continue           # over before the window (a zero-length window)
                entered[rid] = 1
                holds[node] += 1
                if holds[node] == 1:
                    held_free += cur[node]
                    held_nodes.append(node)
            while i_end < n_end and by_end[i_end][0] <= t:
                _, rid, node = by_end[i_end]
                i_end += 1
                if not entered[rid]:
                    continue
                holds[node] -= 1
                if not holds[node]:
                    held_free -= cur[node]
            if total - held_free >= need:
                self._found.append((need, length, t))
                self._released[t] = (k, list(cur), total)
                if len(self._found) > self.REMEMBERED:
                    gone = self._found.pop(0)[2]
                    if all(found != gone for _, _, found in self._found):
                        self._released.pop(gone, None)
                for node in held_nodes:
                    if holds[node]:
                        cur[node] = 0
                placement = select_nodes(cur, need, self.node_cores)
                assert placement is not None
                return t, placement
            # The next candidate: the next release or reservation end after t.
            t = min(rel_t[k] if k < n_released else inf,
                    by_end[i_end][0] if i_end < n_end else inf)
            if t == inf:
                raise AssertionError("every job fits the empty cluster")
            if t > horizon:
                self._beyond.append((need, length, horizon))
                if len(self._beyond) > self.REMEMBERED:
                    self._beyond.pop(0)
                return inf, {}

    def reserve(self, placement: dict[int, int], start: float, length: float) -> None:
        end = start + length
        starts, ends = [], []
        made = self._reservations
        if made + len(placement) > len(self._res_start):     # room for twice as many
            size = 2 * (made + len(placement))
            for name in ("_res_start", "_res_end", "_res_node"):
                grown = numpy.zeros(size, getattr(self, name).dtype)
                grown[:made] = getattr(self, name)[:made]
                setattr(self, name, grown)
        nodes = list(placement)
        self._res_start[made:made + len(nodes)] = start
        self._res_end[made:made + len(nodes)] = end
        self._res_node[made:made + len(nodes)] = nodes
        for node in placement:
            bisect.insort(self.blocks.setdefault(node, []), (start, end))
            self._reservations += 1
            starts.append((start, self._reservations, node, end))
            ends.append((end, self._reservations, node))
        # Its entries share one start and one end and are numbered after every earlier one:
        # they go in as a block after the entries of the same time (a sort would compare all).
        at = bisect.bisect_right(self._by_start, (start, math.inf))
        self._by_start[at:at] = starts
        at = bisect.bisect_right(self._by_end, (end, math.inf))
        self._by_end[at:at] = ends

    def started(self, placement: dict[int, int], expected_end: float) -> None:
        """A job of this pass started now on ``placement`` (the simulation's state already
        holds it): its nodes are read again, and its cores come back at its expected end."""
        self._released.clear()
        for node, cores in placement.items():
            self._steps.pop(node, None)
            self._changed.add(node)
            if self._release_times is not None and expected_end > self.now:
                self._free_now[node] -= cores
                self._total_now -= cores
                i = bisect.bisect_right(self._release_times, expected_end)
                self._release_times.insert(i, expected_end)
                self._release_cores.insert(i, cores)
                self._release_nodes.insert(i, node)


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


@dataclass
class _Reservation:
    """Backfill's reservation for the first job that does not fit: from ``start``, on each of
    its nodes, ``spare`` cores beyond it. A job may start on such a node now only if it is
    expected to end by ``start`` or fits in the spare cores (which it then uses up)."""

    start: float
    spare: dict[int, int]

    def usable(self, node: int, free: int, expected_end: float) -> int:
        if expected_end <= self.start or node not in self.spare:
            return free
        return min(free, self.spare[node])

    def book(self, node: int, cores: int, expected_end: float) -> None:
        """A job started on ``node``: if it still runs at ``start``, it takes spare cores."""
        if node in self.spare and expected_end > self.start:
            self.spare[node] -= cores


@dataclass(frozen=True)
class JobResult:
    job_id: int
    submit_s: float
    start_s: float
    end_s: float
    cores: int
    malleable: bool
    nodes: int = 1
    reference_s: float = 0.0   # start-up and runtime at its requested size (``SimJob``)

    @property
    def response_s(self) -> float:
        return self.end_s - self.submit_s

    @property
    def wait_s(self) -> float:
        return self.start_s - self.submit_s


@dataclass(frozen=True)
class SimResult:
    policy: str
    nodes: int
    cores: int
    jobs: int
    malleable_jobs: int
    core_seconds: float        # cores the jobs' threads used x seconds (start-up excluded)
    makespan_s: float          # first submit to last end
    lower_bound_makespan_s: float
    mean_response_s: float     # submit to end (turnaround)
    p95_response_s: float
    mean_wait_s: float         # submit to start
    p95_wait_s: float
    mean_bounded_slowdown: float   # metrics.bounded_slowdown, tau = TAU_S
    utilisation: float         # core_seconds / (cores x makespan)
    queue_order: str
    backfill: str
    resizes: int               # changes of a running job's cores (per node)
    decide_calls: int
    wall_s: float
    per_job: tuple[JobResult, ...] = ()

    @property
    def mean_completion_s(self) -> float:
        """The earlier name of ``mean_response_s`` (benchmarks/coscheduling/validate.py)."""
        return self.mean_response_s

    def summary(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "per_job"}


# Rounds of offers between a multi-node job's agents settled in one instant: each round
# replans the nodes whose peer cap changed (offers do not depend on peer caps, so the second
# round is normally the last).
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
        self._queue = _Queue(queue_order)
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
        profile = _Profile(self._free, self._ends_on, self.cores, now, self._ends)
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

    def _best_fit_clear(self, need: int, length: float, profile: _Profile,
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

    def _place(self, job: SimJob, reservation: _Reservation | None = None,
               expected_end: float = 0.0) -> dict[int, int] | None:
        """Where Slurm starts the job now: cores per node, or None. A job that fits a node
        gets one (best fit), else (``Placement.SLURM_TASKS`` only) nodes as a wider one does;
        a wider one, nodes by ``select_nodes``."""
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

    def _best_fit(self, need: int, reservation: _Reservation | None = None,
                  expected_end: float = 0.0) -> int | None:
        """The node with the fewest free cores that still holds ``need`` and where a job
        expected to end at ``expected_end`` cannot delay the reservation (deterministic: the
        buckets are sets of ints, iterated in the order CPython keeps them); None if none."""
        for free in range(need, self.cores + 1):
            for node in self._by_free[free]:
                if reservation is None or reservation.usable(node, free, expected_end) >= need:
                    return node
        return None

    def _reserve(self, job: SimJob, now: float) -> _Reservation:
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
            return _Reservation(start=best[0], spare={best[1]: best[2]})
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
        return _Reservation(start=at, spare={n: free[n] - k for n, k in placement.items()})

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
        self._dirty.update(nodes)
        self._touched.add(job.job_id)
        if self.policy is SimPolicy.NODES:
            if self._node_malleable(r):
                self._node_jobs.add(job.job_id)
            self._regain(r)
            self._reenter_releasable(r)

    def _finish(self, r: _Running, now: float) -> None:
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
                                       r.job.reference_s))

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

    def _regain(self, r: _Running) -> None:
        """The job's nodes changed (or it started): its entry among the growth candidates."""
        job_id = r.job.job_id
        self._gain_stamp.pop(job_id, None)
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
        r.nodes = tuple(sorted(placed))
        r.allocation = tuple(placed[n] for n in r.nodes)
        r.current = list(r.allocation)
        r.index = {n: i for i, n in enumerate(r.nodes)}
        r.ranks = tuple(len(a) for a in r.allocation)
        r.known = [{} for _ in r.nodes]
        r.offers, r.caps = [None] * len(r.nodes), [None] * len(r.nodes)
        if r.rate > 0.0:
            self.resizes += 1
        self._touched.add(job_id)
        self._regain(r)
        self._reenter_releasable(r)

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
        response = [r.response_s for r in res]
        wait = [r.wait_s for r in res]
        return SimResult(
            policy=self.policy.value, nodes=self.nodes, cores=self.cores, jobs=len(res),
            malleable_jobs=sum(r.malleable for r in res), core_seconds=self._busy_core_s,
            makespan_s=makespan,
            lower_bound_makespan_s=fluid_lower_bound(self.jobs, self.nodes, self.cores,
                                                     widths=self._widths()),
            mean_response_s=sum(response) / len(res), p95_response_s=percentile(response, 95),
            mean_wait_s=sum(wait) / len(res), p95_wait_s=percentile(wait, 95),
            mean_bounded_slowdown=sum(bounded_slowdown(r.response_s, r.reference_s)
                                      for r in res) / len(res),
            utilisation=(self._busy_core_s / (self.nodes * self.cores * makespan)
                         if makespan else 0.0),
            queue_order=self._queue.order.value, backfill=self.backfill.value,
            resizes=self.resizes, decide_calls=self.decide_calls, wall_s=wall_s,
            per_job=tuple(res))


def simulate(jobs: Sequence[SimJob], *, nodes: int, cores: int, policy: SimPolicy,
             backfill: Backfill = Backfill.CONSERVATIVE, backfill_depth: int = 500,
             backfill_interval_s: float = 30.0,
             queue_order: QueueOrder = QueueOrder.FCFS,
             node_bounds: NodeBounds = NodeBounds(),
             placement: Placement = Placement.SLURM_TASKS, backfill_phase_s: float = 0.0,
             batch_sched_delay_s: float = 3.0,
             backfill_window_s: float = BF_WINDOW_S) -> SimResult:
    return Simulation(jobs, nodes=nodes, cores=cores, policy=policy, backfill=backfill,
                      backfill_depth=backfill_depth, backfill_interval_s=backfill_interval_s,
                      queue_order=queue_order, node_bounds=node_bounds,
                      placement=placement, backfill_phase_s=backfill_phase_s,
                      batch_sched_delay_s=batch_sched_delay_s,
                      backfill_window_s=backfill_window_s).run()
