"""What the co-scheduler sees of one node, and what it decides: typed, immutable, pure."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping

from .request import MalleableSpec


class Policy(enum.Enum):
    STATIC = "static"          # Slurm's allocation only: the baseline
    LEND_IDLE = "lend-idle"    # idle cores shared among malleable jobs, by weight
    THROUGHPUT = "throughput"  # cores where they add the most steps/s, floor at min


@dataclass(frozen=True)
class JobView:
    job_id: int
    user: str
    slurm_cpus: frozenset[int]                 # Slurm's allocation on this node (never changes)
    current_cpus: frozenset[int]               # what the job's cgroup holds now
    spec: MalleableSpec | None = None          # None: not malleable
    requested_cpus: int | None = None          # an explicit cpus=K request
    steps_per_s: Mapping[int, float] = field(default_factory=dict)  # by thread count, per rank

    @property
    def malleable(self) -> bool:
        return self.spec is not None


@dataclass(frozen=True)
class NodeSnapshot:
    node: str
    cpus: frozenset[int]                       # every core of the node Slurm may hand out
    jobs: tuple[JobView, ...]


@dataclass(frozen=True)
class Plan:
    node: str
    targets: Mapping[int, frozenset[int]]      # job id -> cores it should hold
    reasons: Mapping[int, str]

    def changes(self, snapshot: NodeSnapshot) -> dict[int, tuple[frozenset[int], frozenset[int]]]:
        return {j.job_id: (j.current_cpus, self.targets[j.job_id]) for j in snapshot.jobs
                if self.targets.get(j.job_id, j.current_cpus) != j.current_cpus}


class PlanInvariantError(AssertionError):
    pass


def check_plan(snapshot: NodeSnapshot, plan: Plan) -> None:
    """The rules no plan may break: raise if one does."""
    seen: dict[int, int] = {}
    for job in snapshot.jobs:
        target = plan.targets.get(job.job_id)
        if target is None or not target:
            raise PlanInvariantError(f"job {job.job_id} left without cores")
        if not target <= snapshot.cpus:
            raise PlanInvariantError(f"job {job.job_id} given cores outside the node")
        for c in target:
            if c in seen:
                raise PlanInvariantError(f"core {c} given to jobs {seen[c]} and {job.job_id}")
            seen[c] = job.job_id
        if not job.malleable and target != job.slurm_cpus:
            raise PlanInvariantError(f"rigid job {job.job_id} moved off its allocation")
        if job.malleable and len(target) < min(job.spec.min_cpus, len(job.slurm_cpus)):
            raise PlanInvariantError(f"job {job.job_id} below its minimum")
