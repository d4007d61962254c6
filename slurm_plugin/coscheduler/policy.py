"""The pure policies: ``decide(snapshot, policy) -> Plan``. No I/O, no clock.

1. How many cores each malleable job should have (by policy; an explicit request wins within
   the job's bounds). Rigid jobs keep exactly their allocation.
2. Which cores: a job keeps what it holds where it can, its own Slurm cores come first, and
   borrowed cores are taken from the idle ones nearest to what it has, so sets move little and
   stay local. Slurm's allocation is each job's guarantee: its owner gets those cores back
   before anyone borrows them.
"""
from __future__ import annotations

from .model import JobView, NodeSnapshot, Plan, Policy, check_plan


def _bounds(job: JobView, node_cpus: int) -> tuple[int, int]:
    lo = min(job.spec.min_cpus, node_cpus)
    return lo, max(lo, job.spec.max_on(node_cpus))


def _water_fill(counts: dict[int, int], caps: dict[int, int], weights: dict[int, int],
                spare: int) -> dict[int, int]:
    """Give ``spare`` cores one by one to the job furthest below its weighted share."""
    counts = dict(counts)
    while spare > 0:
        open_jobs = [j for j in counts if counts[j] < caps[j]]
        if not open_jobs:
            break
        j = min(open_jobs, key=lambda j: (counts[j] / weights[j], j))
        counts[j] += 1
        spare -= 1
    return counts


def estimated_rate(job: JobView, n: int) -> float:
    """Steps/s at ``n`` cores from what the job has shown: measured points, linear in between,
    and beyond the last point the last measured per-core gain (never negative). A job that has
    shown nothing is assumed to scale linearly."""
    pts = sorted((k, v) for k, v in job.steps_per_s.items() if k > 0 and v > 0)
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


def _throughput_counts(jobs: list[JobView], pool: int, node_cpus: int) -> dict[int, int]:
    """Each job starts at its floor; each further core goes where it adds the most steps/s,
    relative to the job's own rate at its Slurm allocation (jobs are not comparable in
    absolute steps/s)."""
    counts = {j.job_id: _bounds(j, node_cpus)[0] for j in jobs}
    caps = {j.job_id: _bounds(j, node_cpus)[1] for j in jobs}
    base = {j.job_id: max(estimated_rate(j, max(1, len(j.slurm_cpus))), 1e-9) for j in jobs}
    by_id = {j.job_id: j for j in jobs}
    spare = pool - sum(counts.values())
    while spare > 0:
        best, gain = None, 0.0
        for jid in sorted(counts):
            if counts[jid] >= caps[jid]:
                continue
            j = by_id[jid]
            g = (estimated_rate(j, counts[jid] + 1) - estimated_rate(j, counts[jid])) / base[jid]
            if best is None or g > gain:
                best, gain = jid, g
        if best is None:
            break
        counts[best] += 1
        spare -= 1
    return counts


def target_counts(snapshot: NodeSnapshot, policy: Policy) -> tuple[dict[int, int], dict[int, str]]:
    n_node = len(snapshot.cpus)
    mall = [j for j in snapshot.jobs if j.malleable]
    counts = {j.job_id: len(j.slurm_cpus) for j in snapshot.jobs}
    reasons = {j.job_id: "allocation" for j in snapshot.jobs}
    free = n_node - sum(len(j.slurm_cpus) for j in snapshot.jobs)
    # Explicit requests first: they win within the bounds, and a shrink frees cores.
    flexible = []
    for j in mall:
        lo, hi = _bounds(j, n_node)
        if j.requested_cpus is not None:
            counts[j.job_id] = max(lo, min(hi, j.requested_cpus))
            reasons[j.job_id] = f"request cpus={j.requested_cpus}"
            free += len(j.slurm_cpus) - counts[j.job_id]
        else:
            flexible.append(j)
    if policy is Policy.STATIC or not flexible:
        for j in flexible:
            counts[j.job_id] = max(_bounds(j, n_node)[0], len(j.slurm_cpus))
        return _fit(counts, reasons, snapshot), reasons
    if policy is Policy.LEND_IDLE:
        # Every flexible job keeps its allocation (raised to its floor); idle cores are then
        # shared by weight up to each job's maximum.
        base = {j.job_id: max(len(j.slurm_cpus), _bounds(j, n_node)[0]) for j in flexible}
        free -= sum(base[j.job_id] - len(j.slurm_cpus) for j in flexible)
        caps = {j.job_id: _bounds(j, n_node)[1] for j in flexible}
        weights = {j.job_id: j.spec.weight for j in flexible}
        filled = _water_fill(base, caps, weights, max(0, free))
        for j in flexible:
            counts[j.job_id] = filled[j.job_id]
            if counts[j.job_id] > len(j.slurm_cpus):
                reasons[j.job_id] = "lend-idle"
    else:
        pool = sum(len(j.slurm_cpus) for j in flexible) + max(0, free)
        for jid, c in _throughput_counts(flexible, pool, n_node).items():
            counts[jid] = c
            reasons[jid] = "throughput"
    return _fit(counts, reasons, snapshot), reasons


def _fit(counts: dict[int, int], reasons: dict[int, str], snapshot: NodeSnapshot
         ) -> dict[int, int]:
    """Trim growth that does not fit the node (requests above what is free) by taking back from
    the largest borrowers first; floors and rigid jobs are never trimmed."""
    n_node = len(snapshot.cpus)
    over = sum(counts.values()) - n_node
    if over <= 0:
        return counts
    trimmable = sorted((j for j in snapshot.jobs if j.malleable),
                       key=lambda j: -(counts[j.job_id] - len(j.slurm_cpus)))
    for j in trimmable:
        floor = max(_bounds(j, n_node)[0], min(len(j.slurm_cpus), counts[j.job_id]))
        take = min(over, counts[j.job_id] - floor)
        if take > 0:
            counts[j.job_id] -= take
            reasons[j.job_id] += " (trimmed to fit)"
            over -= take
        if over == 0:
            break
    return counts


def assign_cores(snapshot: NodeSnapshot, counts: dict[int, int]) -> dict[int, frozenset[int]]:
    """Concrete core sets for the counts: rigid jobs exactly their allocation; malleable jobs
    first keep cores of their own allocation (those they hold first), then borrow."""
    targets: dict[int, set[int]] = {}
    taken: set[int] = set()
    jobs = sorted(snapshot.jobs, key=lambda j: j.job_id)
    for j in jobs:
        if not j.malleable:
            targets[j.job_id] = set(j.slurm_cpus)
            taken |= j.slurm_cpus
    for j in jobs:
        if j.malleable:
            own = sorted(j.slurm_cpus - taken, key=lambda c: (c not in j.current_cpus, c))
            keep = set(own[: counts[j.job_id]])
            targets[j.job_id] = keep
            taken |= keep
    # What is left: cores no job was given, and allocated cores their owners gave up.
    for j in (j for j in jobs if j.malleable):
        need = counts[j.job_id] - len(targets[j.job_id])
        if need <= 0:
            continue
        mine = targets[j.job_id] or j.current_cpus

        def closeness(c: int) -> tuple:
            near = min((abs(c - m) for m in mine), default=0)
            return (c not in j.current_cpus, near, c)

        grab = sorted(snapshot.cpus - taken, key=closeness)[:need]
        targets[j.job_id] |= set(grab)
        taken |= set(grab)
    return {jid: frozenset(c) for jid, c in targets.items()}


def decide(snapshot: NodeSnapshot, policy: Policy) -> Plan:
    counts, reasons = target_counts(snapshot, policy)
    plan = Plan(node=snapshot.node, targets=assign_cores(snapshot, counts), reasons=reasons)
    check_plan(snapshot, plan)
    return plan
