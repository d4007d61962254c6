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


class ActionKind(enum.Enum):
    SHRINK = "shrink"      # releases cores, takes none
    GROW = "grow"          # takes cores, releases none
    MOVE = "move"          # both
    REALIGN = "realign"    # same cores; step folders put back in line (Slurm reset them)


class Reason(enum.Enum):
    ALLOCATION = "allocation"      # Slurm's allocation (or the min= floor)
    REQUEST = "request"            # the owner's cpus=K
    LEND_IDLE = "lend-idle"
    THROUGHPUT = "throughput"
    RECLAIM = "reclaim"            # a job is starting on the node: lent cores come back
    PEER_CAP = "peer-cap"          # a multi-node job held to what its slowest node gives it
    TRIMMED = "trimmed"            # growth that did not fit the node
    REALIGN = "realign"


@dataclass(frozen=True)
class RankView:
    """What the agent believes of one rank on this node (from its validated status record)."""

    pid: int
    rank: int
    local_rank: int
    local_size: int
    intra_active: int
    steps_per_s: Mapping[int, float] = field(default_factory=dict)
    steps: int = 0

    @property
    def rate_now(self) -> float:
        return self.steps_per_s.get(self.intra_active, 0.0)


@dataclass(frozen=True)
class JobView:
    job_id: int
    uid: int
    user: str
    allocation: frozenset[int]                 # Slurm's cores on this node (never changes)
    current: frozenset[int]                    # what the job's cgroup folder holds now
    spec: MalleableSpec | None = None          # None: not malleable
    requested: int | None = None               # an explicit cpus=K request
    ranks: tuple[RankView, ...] = ()
    has_folder: bool = True                    # False: the job's cgroup is not made yet
    folders_in_line: bool = True               # every step folder agrees with the job folder
    nodes: int = 1                             # nodes of the job (all of them)
    peer_cap_per_rank: int | None = None       # the smallest offer of the job's other nodes

    @property
    def malleable(self) -> bool:
        return self.spec is not None

    @property
    def local_size(self) -> int:
        """Ranks of the job on this node (1 when none has reported)."""
        return max([1] + [r.local_size for r in self.ranks])

    @property
    def steps_per_s(self) -> dict[int, float]:
        """Steps/s by node cores (ranks x threads), the mean over the ranks: only counts every
        rank has measured."""
        if not self.ranks:
            return {}
        n = len(self.ranks)
        sums: dict[int, list[float]] = {}
        for r in self.ranks:
            for k, v in r.steps_per_s.items():
                sums.setdefault(k * n, []).append(v)
        return {k: sum(v) / len(v) for k, v in sums.items() if len(v) == n}


@dataclass(frozen=True)
class NodeSnapshot:
    node: str
    cpus: frozenset[int]                       # every core of the node Slurm may hand out
    jobs: tuple[JobView, ...]
    # Jobs starting here whose cores are not known yet (the Prolog marked them): until they are,
    # no job may hold cores outside its own allocation.
    pending_starts: tuple[int, ...] = ()
    max_cpus: int | None = None                # the site's limit on a job's cores (per node)

    def job(self, job_id: int) -> JobView:
        return next(j for j in self.jobs if j.job_id == job_id)


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    job_id: int
    uid: int
    allocation: frozenset[int]
    before: frozenset[int]
    after: frozenset[int]
    threads_per_rank: tuple[int, ...]
    reason: Reason

    @property
    def releases(self) -> frozenset[int]:
        return self.before - self.after

    @property
    def takes(self) -> frozenset[int]:
        return self.after - self.before


@dataclass(frozen=True)
class Plan:
    node: str
    policy: Policy
    targets: Mapping[int, frozenset[int]]      # job id -> cores it should hold
    reasons: Mapping[int, Reason]
    actions: tuple[Action, ...]
    offers: Mapping[int, int] = field(default_factory=dict)   # multi-node job -> cores per rank


class PlanInvariantError(AssertionError):
    pass


def check_plan(snapshot: NodeSnapshot, plan: Plan) -> None:
    """The rules no plan may break: raise if one does."""
    seen: dict[int, int] = {}
    n_node = len(snapshot.cpus)
    for job in snapshot.jobs:
        target = plan.targets.get(job.job_id)
        if not target:
            raise PlanInvariantError(f"job {job.job_id} left without cores")
        if not target <= snapshot.cpus:
            raise PlanInvariantError(f"job {job.job_id} given cores outside the node")
        for c in target:
            if c in seen:
                raise PlanInvariantError(f"core {c} given to jobs {seen[c]} and {job.job_id}")
            seen[c] = job.job_id
        if not job.malleable or not job.has_folder:
            if target != job.allocation:
                raise PlanInvariantError(f"job {job.job_id} moved off its allocation")
            continue
        cap = max(job.spec.max_on(n_node), job.spec.min_cpus)
        if snapshot.max_cpus is not None:
            cap = min(cap, snapshot.max_cpus)
        if len(target) > max(cap, len(job.allocation)):
            raise PlanInvariantError(f"job {job.job_id} above its maximum")
        if snapshot.pending_starts and not target <= job.allocation:
            raise PlanInvariantError(f"job {job.job_id} holds lent cores while a job starts")
        if len(target) < min(job.spec.min_cpus, len(job.allocation)):
            raise PlanInvariantError(f"job {job.job_id} below its minimum")
    for a in plan.actions:
        if a.after != plan.targets[a.job_id]:
            raise PlanInvariantError(f"action for job {a.job_id} disagrees with its target")
