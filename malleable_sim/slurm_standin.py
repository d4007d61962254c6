"""Slurm's part is a stand-in for its two schedulers. The main one runs for arrivals and ends
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

Here: the queue (``JobQueue``), node selection (``select_nodes``), the agents' per-rank offers
across a multi-node job's nodes (``peer_cap``), and the backfill pass's view of the cluster
(``BackfillProfile``) with the reservation of EASY backfill's first job (``Reservation``). The
event loop that runs them is ``engine.Simulation``."""
from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass
from typing import Sequence

import numpy

from .config import QueueOrder
from .workload import SimJob


class JobQueue:
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


class BackfillProfile:
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
class Reservation:
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


def eval_nodes(free: Sequence[int], need: int) -> dict[int, int] | None:
    """select/cons_tres's _eval_nodes (cons_tres/job_test.c, Slurm 22.05) for ``sbatch -n
    need`` (one node asked at least, no weights, no GRES): the usable nodes (free > 0) in runs
    of consecutive node numbers; the run picked is the first that holds the job, or the
    tightest that does (fewest CPUs), else the largest; in it, the tightest single node that
    holds what is left (the first among equals), else its nodes in node order, each giving its
    free CPUs and the last what is left; then the next run. None if the nodes are too few."""
    if sum(free) < need:
        return None
    runs: list[list[int]] = []
    prev = -2
    for n, f in enumerate(free):
        if f > 0:
            if n == prev + 1 and runs:
                runs[-1].append(n)
            else:
                runs.append([n])
            prev = n
    chosen: dict[int, int] = {}
    rem, rem_nodes = need, 1
    while runs and rem > 0:
        best, best_cpus, best_suff = 0, -1, False
        for k, run in enumerate(runs):
            cpus = sum(free[n] for n in run)
            suff = cpus >= rem
            if best_cpus < 0 or (suff and not best_suff) or (suff and cpus < best_cpus) or \
                    (not suff and not best_suff and cpus > best_cpus):
                best, best_cpus, best_suff = k, cpus, suff
        run = runs.pop(best)
        if rem_nodes <= 1:
            single = None
            for n in run:
                if free[n] >= rem and (single is None or free[n] < free[single]):
                    single = n
                    if free[n] == rem:
                        break
            if single is not None:
                run = [single]
        for n in run:
            if rem <= 0 and rem_nodes <= 0:
                break
            take = min(free[n], rem)
            if take <= 0:
                continue
            chosen[n] = take
            rem -= take
            rem_nodes -= 1
    return chosen if rem <= 0 else None
