"""Deciding in whole cores: on a node whose cores have several hardware threads and where Slurm
allocates cores (CR_Core), a core's threads go together, never one to each of two jobs.

``decide`` runs unchanged on the node seen core by core (each core one unit, every count in
cores: a job's bounds, requests, its ranks' thread counts and measured rates, the site's
limits), and its targets come back as every thread of each core. Each step's block and each
rank's thread count are then of whole cores' threads (a rank runs one thread per CPU it holds,
as plain TensorFlow does). A job whose allocation holds part of a core (Slurm allocating single
threads, which slurm.conf(5) says CR_CPU does not do once the node's threads are declared)
cannot be decided so: ``SplitCores``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

from .decide import decide, plan_actions
from .model import JobView, NodeSnapshot, Plan, PlanInvariantError, Policy, RankView, check_plan
from .request import MalleableSpec


class SplitCores(ValueError):
    """Slurm gave a job part of a core: the node cannot be lent in whole cores."""


@dataclass(frozen=True)
class CoreMap:
    """The node's cores, each the set of its hardware threads' CPU ids, in the order the node
    numbers its cores; unit ``i`` is core ``i``."""
    cores: tuple[frozenset[int], ...]
    _unit: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sizes = {len(c) for c in self.cores}
        unit = {cpu: i for i, core in enumerate(self.cores) for cpu in core}
        if len(sizes) != 1 or 0 in sizes or len(unit) != sum(map(len, self.cores)):
            raise ValueError("cores must be disjoint, non-empty and of one size")
        object.__setattr__(self, "_unit", unit)

    @property
    def threads(self) -> int:
        return len(self.cores[0])

    def units(self, cpus: frozenset[int]) -> frozenset[int]:
        """The cores ``cpus`` touches."""
        try:
            return frozenset(self._unit[c] for c in cpus)
        except KeyError as exc:
            raise PlanInvariantError(f"CPU {exc.args[0]} is in no core of the node") from None

    def cpus(self, units: frozenset[int]) -> frozenset[int]:
        return frozenset().union(*(self.cores[u] for u in units))

    def whole(self, cpus: frozenset[int]) -> bool:
        return self.cpus(self.units(cpus)) == cpus

    def at_least(self, n: int) -> int:
        """Cores that hold at least ``n`` CPUs."""
        return math.ceil(n / self.threads)

    def at_most(self, n: int) -> int:
        """Cores within ``n`` CPUs (at least one)."""
        return max(1, n // self.threads)


def _spec(spec: MalleableSpec | None, m: CoreMap) -> MalleableSpec | None:
    if spec is None:
        return None
    return replace(spec, min_cpus=m.at_least(spec.min_cpus),
                   max_cpus=None if spec.max_cpus is None else m.at_most(spec.max_cpus))


def _rank(r: RankView, m: CoreMap) -> RankView:
    rates: dict[int, float] = {}
    for k, v in r.steps_per_s.items():
        rates[m.at_least(k)] = max(v, rates.get(m.at_least(k), 0.0))
    return replace(r, intra_active=m.at_least(r.intra_active), steps_per_s=rates)


def _job(j: JobView, m: CoreMap) -> JobView:
    if not m.whole(j.allocation):
        raise SplitCores(f"job {j.job_id} was given part of a core "
                         f"({sorted(j.allocation)}): Slurm split a core between jobs here")
    return replace(
        j, allocation=m.units(j.allocation), current=m.units(j.current), spec=_spec(j.spec, m),
        requested=None if j.requested is None else m.at_least(j.requested),
        ranks=tuple(_rank(r, m) for r in j.ranks),
        peer_cap_per_rank=None if j.peer_cap_per_rank is None
        else m.at_most(j.peer_cap_per_rank))


def core_snapshot(snapshot: NodeSnapshot, m: CoreMap) -> NodeSnapshot:
    """The node seen core by core."""
    limits = snapshot.limits
    if limits.max_borrowed_cpus is not None:
        limits = replace(limits, max_borrowed_cpus=limits.max_borrowed_cpus // m.threads)
    # A core counts when all its threads are the node's to share.
    return replace(snapshot, cpus=frozenset(u for u in m.units(snapshot.cpus)
                                            if m.cores[u] <= snapshot.cpus),
                   jobs=tuple(_job(j, m) for j in snapshot.jobs),
                   max_cpus=None if snapshot.max_cpus is None else m.at_most(snapshot.max_cpus),
                   limits=limits)


def decide_whole_cores(snapshot: NodeSnapshot, policy: Policy, cores: Sequence[frozenset[int]]
                       ) -> Plan:
    """``decide`` in whole cores (the module's docstring); the plan is in CPU ids and checked
    against the node's own snapshot."""
    m = CoreMap(tuple(cores))
    seen = core_snapshot(snapshot, m)
    by_core = decide(seen, policy)
    by_id = {j.job_id: j for j in seen.jobs}
    targets = {job_id: m.cpus(units) for job_id, units in by_core.targets.items()}

    def split(job: JobView, cpus: frozenset[int]) -> dict[str, frozenset[int]]:
        blocks = by_id[job.job_id].step_cpus(m.units(cpus))
        return {step: m.cpus(units) for step, units in blocks.items()}

    plan = Plan(node=snapshot.node, policy=policy, targets=targets, reasons=by_core.reasons,
                actions=plan_actions(snapshot, targets, by_core.reasons, split),
                offers={j: n * m.threads for j, n in by_core.offers.items()})
    check_plan(snapshot, plan)
    return plan
