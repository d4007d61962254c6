"""The pure policies: ``decide(snapshot, policy) -> Plan``. No I/O, no clock.

1. How many cores each malleable job should have (by policy; an explicit request wins within
   the job's bounds). Rigid jobs, jobs whose cgroup is not made yet and jobs with a step
   starting (fenced) keep exactly their allocation. While a job is starting on the node with cores not known yet, nobody holds cores
   outside their own allocation.
2. A multi-node job is one job: each node offers it cores per rank, and no node gives it more
   per rank than the smallest offer of its other nodes (a synchronous job runs at its slowest
   rank's pace); the surplus goes to other jobs.
3. Which cores: a job keeps what it holds where it can, its own Slurm cores come first, and
   borrowed cores are the idle ones nearest to what it has. Slurm's allocation is each job's
   guarantee: its owner gets those cores back before anyone borrows them, and a job holds
   fewer only when its owner asked (cpus=), never for a max= or the site's limit below it.
4. Actions: what changes for each job, with each rank's thread target (the protocol's split),
   and each step's block of cores when ranks of several steps share the node.

What a job's user says (weight=, min=/max=/cpus= in the Comment, the steps/s of its own status
records) is bounded by what the site and the agent know (``NodeSnapshot.limits``, from
``AgentConfig``): a weight counts only up to its partition's maximum (the site's table; 1 where
the site set nothing), no user's jobs hold more than ``max_borrowed_cpus`` cores above their
allocations together, whatever they ask or claim (8 where the site set nothing), and a claimed
gain per core counts at most as linear scaling from the job's own rate at its allocation
(``LINEAR_GAIN``, always): a lie about steps/s wins no more than saying nothing would.
"""
from __future__ import annotations

import bisect
import heapq
from typing import Callable, Mapping

from .model import (Action, ActionKind, JobView, NodeSnapshot, Plan, PlanInvariantError, Policy,
                    Reason, check_plan)


# The most one more core can be credited with, in core-equivalents (the job's own steps/s per
# allocated core): linear scaling. A job that claims more (superlinear, or a made-up jump such as
# {1: 1, 2: 1e8}) is counted as linear, so its own numbers never beat an honest linear job of the
# same allocation (ties go as before: fewest cores per allocated core, then lowest id). No slack:
# any would let a claim win every tie with an honest linear job.
LINEAR_GAIN = 1.0


def _bounds(job: JobView, snapshot: NodeSnapshot, *, peer_cap: bool = True) -> tuple[int, int]:
    n_node = len(snapshot.cpus)
    if snapshot.max_cpus is not None:    # the site's limit holds for max=node too
        n_node = min(n_node, max(snapshot.max_cpus, 1))
    if job.spec is None:
        raise PlanInvariantError(f"job {job.job_id} is rigid: it has no bounds")
    alloc = len(job.allocation)
    lo = min(job.spec.min_cpus, n_node)
    # Slurm's allocation is the job's floor and never above its ceiling: a max= (or the site's
    # limit) below it never shrinks the job. Only its owner's own cpus= goes below, down to lo.
    hi = max(lo, job.spec.max_on(n_node), alloc)
    ceiling = snapshot.limits.borrow_ceiling(job)
    if ceiling is not None:   # the site's limit on borrowing: for min= and cpus= too
        lo, hi = min(lo, ceiling), min(hi, ceiling)
    if snapshot.pending_starts:
        # The reclaim: the allocation is the only guarantee while cores are unknown.
        return min(lo, alloc), min(hi, alloc)
    if peer_cap and job.peer_cap_per_rank is not None:
        # Borrowed cores only: a job never falls below its own allocation for a peer.
        hi = max(min(hi, job.peer_cap_per_rank * job.local_size), min(alloc, hi), lo)
    return lo, hi


class BorrowBudget:
    """What each user may still borrow on the node: the site's ``max_borrowed_cpus`` is for all
    of one user's jobs together, so k jobs of his do not borrow k times as much. Floors,
    requests and the fills take from it in that order, jobs in id order. None: no limit."""

    def __init__(self, snapshot: NodeSnapshot, jobs: list[JobView]):
        cap = snapshot.limits.max_borrowed_cpus
        self._uid = {j.job_id: j.uid for j in jobs}
        self._alloc = {j.job_id: len(j.allocation) for j in jobs}
        self._left: dict[int, int] | None = None if cap is None else \
            {j.uid: max(0, cap) for j in jobs}

    def grant(self, job_id: int, more: int) -> int:
        """Of ``more`` cores the job wants above what it holds at or above its allocation, how
        many its user may still borrow (taken from his budget)."""
        if self._left is None or more <= 0:
            return max(0, more)
        uid = self._uid[job_id]
        given = min(more, self._left[uid])
        self._left[uid] -= given
        return given

    def allows(self, job_id: int, n: int) -> bool:
        """Whether the job may go from ``n`` cores to ``n + 1``."""
        return self._left is None or n < self._alloc[job_id] or \
            self._left[self._uid[job_id]] > 0

    def take(self, job_id: int, n: int) -> None:
        """The job went from ``n`` cores to ``n + 1``."""
        if self._left is not None and n >= self._alloc[job_id]:
            self._left[self._uid[job_id]] -= 1


def _water_fill(counts: dict[int, int], caps: dict[int, int], weights: dict[int, int],
                spare: int, budget: BorrowBudget | None = None) -> dict[int, int]:
    """Give ``spare`` cores one by one to the job furthest below its weighted share (ties: the
    lowest id), while its user's ``budget`` allows. A heap of the jobs below their caps, by
    that key: each core costs a log, not a scan of every job (the agent on a 64-core node, and
    the simulator's thousands of nodes)."""
    counts = dict(counts)
    below_cap = [(counts[j] / weights[j], j) for j in counts if counts[j] < caps[j]]
    heapq.heapify(below_cap)
    while spare > 0 and below_cap:
        _, j = heapq.heappop(below_cap)
        if budget is not None:
            if not budget.allows(j, counts[j]):
                continue          # its user borrowed all he may: it stays where it is
            budget.take(j, counts[j])
        counts[j] += 1
        spare -= 1
        if counts[j] < caps[j]:
            heapq.heappush(below_cap, (counts[j] / weights[j], j))
    return counts


def measured_points(job: JobView) -> tuple[tuple[int, float], ...]:
    """The job's steps/s by node cores that it has shown, sorted by cores."""
    return tuple(sorted((k, v) for k, v in job.steps_per_s.items() if k > 0 and v > 0))


def estimated_rate(pts: tuple[tuple[int, float], ...], n: int) -> float:
    """Steps/s at ``n`` cores from what a job has shown (``measured_points``): measured points,
    linear in between, and beyond the last point the last measured per-core gain (never
    negative). A job that has shown nothing is assumed to scale linearly."""
    if not pts:
        return float(n)
    if n <= pts[0][0]:
        return pts[0][1] * n / pts[0][0]
    for (k0, v0), (k1, v1) in zip(pts, pts[1:]):
        if k0 <= n <= k1:
            return v0 + (v1 - v0) * (n - k0) / (k1 - k0)
    if len(pts) >= 2:
        (k0, v0), (k1, v1) = pts[-2], pts[-1]
        slope = max(0.0, (v1 - v0) / (k1 - k0))
    else:
        slope = pts[-1][1] / pts[-1][0]
    return pts[-1][1] + slope * (n - pts[-1][0])


def _throughput_counts(jobs: list[JobView], bounds: dict[int, tuple[int, int]],
                       pool: int, budget: BorrowBudget | None = None) -> dict[int, int]:
    """Each job starts at its allocation (or its floor, if higher); each further core goes where
    it adds the most work in core-equivalents: the steps/s it adds over the job's own steps/s
    per allocated core (jobs are not comparable in absolute steps/s; a cluster counts work in
    core-hours). Dividing by the job's whole rate instead made a linearly scaling job's core
    worth 1/allocation, so the narrowest jobs took all idle cores and the wide, long ones that
    set the makespan stayed narrow. Equal gains are shared in proportion to the allocations. A
    core that adds nothing, or slows a job down (by its telemetry), stays idle. (`malleable
    simulate`, 1000 nodes, saturated: makespan +5.0% against static before, -9.8% now.)

    The trust boundary: the steps/s come from the jobs' own status records, which their users
    can write. They only decide how cores nobody was allocated are shared; a job's own
    allocation is never taken for another on the strength of a claimed rate. And a claimed gain
    counts at most as linear scaling from the job's own rate at its allocation (``LINEAR_GAIN``):
    a claim of superlinear scaling counts as linear, so a liar ties an honest linear job of the
    same allocation (the idle cores are shared) and wins nothing over a job that reports nothing
    (assumed linear). What a claim of linear scaling can still win from an honest sublinear
    job is bounded by the site's ``max_borrowed_cpus`` (``_bounds``); checking the claims
    against the CPU time the job really used is not done here."""
    counts = {j.job_id: max(bounds[j.job_id][0], min(len(j.allocation), bounds[j.job_id][1]))
              for j in jobs}
    alloc = {j.job_id: max(1, len(j.allocation)) for j in jobs}
    points = {j.job_id: measured_points(j) for j in jobs}   # read once: the telemetry is fixed
    uid_of = {j.job_id: j.uid for j in jobs}

    def next_core(jid: int) -> tuple[float, float] | None:
        """What one more core is worth to the job: its gain (rounded, so that float noise does
        not break a tie), then how far it is below its share of the allocations; None at its
        maximum or where the core adds nothing."""
        if counts[jid] >= bounds[jid][1] or \
                (budget is not None and not budget.allows(jid, counts[jid])):
            return None
        pts, n = points[jid], counts[jid]
        per_core = max(estimated_rate(pts, alloc[jid]) / alloc[jid], 1e-9)
        gain = (estimated_rate(pts, n + 1) - estimated_rate(pts, n)) / per_core
        gain = round(min(gain, LINEAR_GAIN), 9)   # a claim above linear counts as linear
        return (gain, -n / alloc[jid]) if gain > 0 else None

    # Only the job that got the last core changes its worth: the others are kept.
    worth = {jid: next_core(jid) for jid in sorted(counts)}
    spare = pool - sum(counts.values())
    while spare > 0:
        best, best_key = None, None
        for jid, key in worth.items():   # ties: the lowest id, as the dict is in id order
            if key is not None and (best_key is None or key > best_key):
                best, best_key = jid, key
        if best is None:
            break   # no core adds work anywhere: the rest stay idle
        if budget is not None:
            budget.take(best, counts[best])
        counts[best] += 1
        spare -= 1
        if budget is not None and counts[best] > alloc[best]:
            # The user's budget shrank: each job of his is worth what it may still borrow.
            uid = uid_of[best]
            worth.update({j: next_core(j) for j in worth if uid_of[j] == uid})
        else:
            worth[best] = next_core(best)
    return counts


def target_counts(snapshot: NodeSnapshot, policy: Policy, *, peer_cap: bool = True
                  ) -> tuple[dict[int, int], dict[int, Reason]]:
    n_node = len(snapshot.cpus)
    mall = [j for j in snapshot.jobs if j.resizable]
    counts = {j.job_id: len(j.allocation) for j in snapshot.jobs}
    reasons = {j.job_id: Reason.STEP_START if j.fenced else Reason.ALLOCATION
               for j in snapshot.jobs}
    bounds = {j.job_id: _bounds(j, snapshot, peer_cap=peer_cap) for j in mall}
    # The site's borrowing limit is per user: floors above the allocation (min=) first, then
    # requests, then the fills take from what each user may still borrow.
    budget = BorrowBudget(snapshot, mall)
    for j in mall:
        lo, hi = bounds[j.job_id]
        alloc = len(j.allocation)
        if lo > alloc:
            lo = alloc + budget.grant(j.job_id, lo - alloc)
            bounds[j.job_id] = (lo, max(lo, hi))
    free = n_node - sum(len(j.allocation) for j in snapshot.jobs)
    # Explicit requests first: they win within the bounds, and a shrink frees cores.
    flexible = []
    for j in mall:
        lo, hi = bounds[j.job_id]
        if j.requested is not None:
            asked = max(lo, min(hi, j.requested))
            held = max(lo, len(j.allocation))      # what the floor already took
            counts[j.job_id] = asked if asked <= held else \
                held + budget.grant(j.job_id, asked - held)
            reasons[j.job_id] = Reason.REQUEST
            free += len(j.allocation) - counts[j.job_id]
        else:
            flexible.append(j)
    if policy is Policy.STATIC or snapshot.pending_starts or not flexible:
        for j in flexible:
            counts[j.job_id] = max(bounds[j.job_id][0], len(j.allocation))
    elif policy is Policy.LEND_IDLE:
        # Every flexible job keeps its allocation (raised to its floor); idle cores are then
        # shared by weight up to each job's maximum.
        base = {j.job_id: max(len(j.allocation), bounds[j.job_id][0]) for j in flexible}
        free -= sum(base[j.job_id] - len(j.allocation) for j in flexible)
        caps = {j.job_id: max(bounds[j.job_id][1], base[j.job_id]) for j in flexible}
        weights = {j.job_id: snapshot.limits.weight(j) for j in flexible}   # the site's cap
        filled = _water_fill(base, caps, weights, max(0, free), budget)
        for j in flexible:
            counts[j.job_id] = filled[j.job_id]
            if counts[j.job_id] > len(j.allocation):
                reasons[j.job_id] = Reason.LEND_IDLE
    else:
        pool = sum(len(j.allocation) for j in flexible) + max(0, free)
        for jid, c in _throughput_counts(flexible, bounds, pool, budget).items():
            counts[jid] = c
            reasons[jid] = Reason.THROUGHPUT
    if snapshot.pending_starts:
        for j in mall:
            if counts[j.job_id] < len(j.current):
                reasons[j.job_id] = Reason.RECLAIM
    elif peer_cap:
        for j in mall:
            if j.peer_cap_per_rank is not None and j.requested is None and \
                    counts[j.job_id] == bounds[j.job_id][1] and \
                    bounds[j.job_id][1] < _bounds(j, snapshot, peer_cap=False)[1]:
                reasons[j.job_id] = Reason.PEER_CAP
    return _fit(counts, reasons, snapshot, bounds), reasons


def _fit(counts: dict[int, int], reasons: dict[int, Reason], snapshot: NodeSnapshot,
         bounds: dict[int, tuple[int, int]]) -> dict[int, int]:
    """Trim growth that does not fit the node (requests above what is free) by taking back from
    the largest borrowers first; floors and rigid jobs are never trimmed."""
    over = sum(counts.values()) - len(snapshot.cpus)
    if over <= 0:
        return counts
    trimmable = sorted((j for j in snapshot.jobs if j.job_id in bounds),
                       key=lambda j: -(counts[j.job_id] - len(j.allocation)))
    for j in trimmable:
        floor = max(bounds[j.job_id][0], min(len(j.allocation), counts[j.job_id]))
        take = min(over, counts[j.job_id] - floor)
        if take > 0:
            counts[j.job_id] -= take
            reasons[j.job_id] = Reason.TRIMMED
            over -= take
        if over == 0:
            break
    return counts


def assign_cores(snapshot: NodeSnapshot, counts: dict[int, int]) -> dict[int, frozenset[int]]:
    """Concrete core sets for the counts: rigid jobs exactly their allocation; malleable jobs
    first keep cores of their own allocation (those they hold first), then borrow. Sets that
    do not change are passed on as they are, not copied (the agent makes this plan for every
    job at every event: copies were a sixth of decide's time)."""
    targets: dict[int, frozenset[int]] = {}
    taken: set[int] = set()
    jobs = sorted(snapshot.jobs, key=lambda j: j.job_id)
    flexible = [j for j in jobs if j.resizable]
    for j in jobs:
        if not j.resizable:
            targets[j.job_id] = j.allocation
            taken |= j.allocation
    for j in flexible:
        own = j.allocation - taken if taken else j.allocation
        if counts[j.job_id] < len(own):   # else every one of them: their order does not matter
            own = frozenset(sorted(own, key=lambda c: (c not in j.current, c))
                            [: counts[j.job_id]])
        targets[j.job_id] = own
        taken |= own
    # What is left: cores no job was given, and allocated cores their owners gave up.
    for j in flexible:
        need = counts[j.job_id] - len(targets[j.job_id])
        if need <= 0:
            continue
        mine = sorted(targets[j.job_id] or j.current)

        def closeness(c: int) -> tuple[bool, int, int]:
            return (c not in j.current, _distance_to_nearest(mine, c), c)

        grab = sorted(snapshot.cpus - taken, key=closeness)[:need]
        targets[j.job_id] = targets[j.job_id].union(grab)
        taken.update(grab)
    return targets


def _distance_to_nearest(sorted_cores: list[int], c: int) -> int:
    """How far ``c`` is from the nearest of ``sorted_cores`` (0 when there are none)."""
    if not sorted_cores:
        return 0
    i = bisect.bisect_left(sorted_cores, c)
    if i == 0:
        return sorted_cores[0] - c
    if i == len(sorted_cores):
        return c - sorted_cores[-1]
    return min(sorted_cores[i] - c, c - sorted_cores[i - 1])


def _kind(before: frozenset[int], after: frozenset[int]) -> ActionKind | None:
    if before == after:
        return None
    if after <= before:
        return ActionKind.SHRINK
    if before <= after:
        return ActionKind.GROW
    return ActionKind.MOVE


def plan_actions(snapshot: NodeSnapshot, targets: Mapping[int, frozenset[int]],
                 reasons: Mapping[int, Reason],
                 split: Callable[[JobView, frozenset[int]], dict[str, frozenset[int]]]
                 = JobView.step_cpus) -> tuple[Action, ...]:
    """The actions that bring each job's folder to its target; ``split`` gives each step's
    block of a job's cores (whole cores: ``whole_cores``)."""
    actions = []
    for j in snapshot.jobs:
        if not j.has_folder:
            continue   # Slurm makes the folder on exactly the allocation: nothing to write
        after = targets[j.job_id]
        kind = _kind(j.current, after)
        reason = reasons[j.job_id]
        if kind is None:
            if j.folders_in_line:
                continue
            kind, reason = ActionKind.REALIGN, Reason.REALIGN
        steps = split(j, after)
        actions.append(Action(kind=kind, job_id=j.job_id, uid=j.uid, allocation=j.allocation,
                              before=j.current, after=after,
                              threads_per_rank=j.threads_per_rank(after, steps),
                              reason=reason, step_cpus=steps))
    return tuple(actions)


def decide(snapshot: NodeSnapshot, policy: Policy) -> Plan:
    counts, reasons = target_counts(snapshot, policy)
    targets = assign_cores(snapshot, counts)
    offers = {}
    multi_node = [j for j in snapshot.jobs if j.resizable and j.nodes > 1]
    if multi_node and not snapshot.pending_starts:   # only they need the uncapped counts
        uncapped, _ = target_counts(snapshot, policy, peer_cap=False)
        offers = {j.job_id: max(1, uncapped[j.job_id] // j.local_size) for j in multi_node}
    plan = Plan(node=snapshot.node, policy=policy, targets=targets, reasons=reasons,
                actions=plan_actions(snapshot, targets, reasons), offers=offers)
    check_plan(snapshot, plan)
    return plan
