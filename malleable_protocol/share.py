"""How the cores of one node are split among a job's ranks there: the one function both the
agent (to tell each rank its thread target) and each rank (to pick its cores) use."""
from __future__ import annotations

from typing import Iterable


def rank_share(cpus: Iterable[int], local_rank: int, local_size: int,
               usable: int | None = None) -> frozenset[int]:
    """Rank ``local_rank``'s cores when ``local_size`` ranks split ``cpus``: contiguous blocks in
    CPU order whose sizes differ by at most one, the larger ones first. ``usable`` caps how many
    of the cores count (a CPU quota of fewer cores than the set). With fewer cores than ranks,
    ranks share one core each."""
    if isinstance(local_size, bool) or not isinstance(local_size, int) or local_size < 1 or \
            isinstance(local_rank, bool) or not isinstance(local_rank, int) or \
            not 0 <= local_rank < local_size:
        raise ValueError(f"bad local rank {local_rank!r} of {local_size!r}")
    ordered = sorted(set(cpus))
    if usable is not None:
        ordered = ordered[:max(1, usable)]
    if not ordered:
        raise ValueError("no cores to share")
    if len(ordered) < local_size:
        return frozenset({ordered[local_rank % len(ordered)]})
    base, extra = divmod(len(ordered), local_size)
    start = local_rank * base + min(local_rank, extra)
    size = base + (1 if local_rank < extra else 0)
    return frozenset(ordered[start:start + size])


def threads_per_rank(cpus: Iterable[int], local_size: int) -> tuple[int, ...]:
    """Each local rank's thread target for a node's cores, in local-rank order: the sizes of
    ``rank_share``'s blocks, counted rather than built (the agent asks this of every job it
    resizes; a job with a rank per core made as many sorted copies of its cores)."""
    n = len(frozenset(cpus))
    if isinstance(local_size, bool) or not isinstance(local_size, int) or local_size < 1:
        raise ValueError(f"bad local size {local_size!r}")
    if n == 0:
        raise ValueError("no cores to share")
    if n < local_size:
        return (1,) * local_size
    base, extra = divmod(n, local_size)
    return (base + 1,) * extra + (base,) * (local_size - extra)
