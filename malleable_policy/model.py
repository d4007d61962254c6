"""What the co-scheduler sees of one node, what it decides, and what became of each action:
typed, immutable, pure."""
from __future__ import annotations

import enum
import functools
import signal
from dataclasses import dataclass, field
from typing import Mapping

from malleable_protocol import rank_share, threads_per_rank
from malleable_protocol.records import MAX_RANK_RECORDS

from .request import MalleableSpec


class Policy(enum.Enum):
    STATIC = "static"          # Slurm's allocation only: the baseline
    LEND_IDLE = "lend-idle"    # idle cores shared among malleable jobs, by weight
    THROUGHPUT = "throughput"  # cores where they add the most work (core-equivalents)


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
    STEP_START = "step-start"      # a step of the job is starting: back to its allocation
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
    step: str = "step_0"       # the job step (cgroup folder) the process runs in
    # The signal its record names as "look again" (RankStatus.reload_signal); None: send none.
    reload_signal: int | None = int(signal.SIGUSR1)

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
    fenced: bool = False                       # a step is starting: held to its allocation
    steps: tuple[str, ...] = ()                # the job's step folders on this node
    # Why the job's own input (records, folders) cannot be believed this cycle: it is then
    # held to exactly its allocation, and every other job goes on (the failure boundary).
    fault: str | None = None
    # It holds borrowed cores and a folder below it became its user's again (v1: slurmstepd
    # made a task folder): the executor gives it back to root this cycle.
    unsealed: bool = False
    partition: str = ""                        # Slurm's partition (the feed's; admin-set)

    @property
    def malleable(self) -> bool:
        return self.spec is not None

    @functools.cached_property   # asked dozens of times per decide; the fields never change
    def resizable(self) -> bool:
        """Whether the policy may choose this job's cores now (else: exactly its allocation)."""
        return self.malleable and self.has_folder and not self.fenced and self.fault is None

    @functools.cached_property
    def _ranks_per_step(self) -> Mapping[str, int]:
        claimed: dict[str, int] = {}
        for r in self.ranks:
            claimed[r.step] = max(claimed.get(r.step, 1), r.local_size)
        if sum(claimed.values()) <= MAX_RANK_RECORDS:
            return claimed
        # More than the job's folder can hold a record for: not all managed ranks; counted as
        # reported instead (at most MAX_RANK_RECORDS in all), so that a job claiming 4,096
        # ranks in each of 1,000 steps costs root no more than its records do.
        reported: dict[str, set[int]] = {}
        for r in self.ranks:
            reported.setdefault(r.step, set()).add(r.local_rank)
        return {step: len(seen) for step, seen in reported.items()}

    @property
    def ranks_per_step(self) -> dict[str, int]:
        """Each step's ranks on this node: the largest local size its ranks report, or, when
        the steps' sizes add up to more ranks than have records, the ranks that reported."""
        return dict(self._ranks_per_step)

    @functools.cached_property
    def local_size(self) -> int:
        """Ranks of the job on this node, every step's (1 when none has reported)."""
        return max(1, sum(self.ranks_per_step.values()))

    @property
    def units_per_step(self) -> dict[str, int]:
        """What the job's cores are split by: each step's ranks, and one unit for each srun
        step whose ranks have not reported yet (its processes get a block of their own from the
        start, rather than run beside another step's ranks on all of the job's cores). A batch
        or interactive shell without ranks counts for nothing: it mostly waits on srun."""
        units = self.ranks_per_step
        for step in self.steps:
            if step not in units and step not in SHELL_STEPS:
                units[step] = 1
        return units

    def step_cpus(self, cpus: frozenset[int]) -> dict[str, frozenset[int]]:
        """See ``split_among_steps``."""
        return split_among_steps(cpus, self.units_per_step)

    def threads_per_rank(self, cpus: frozenset[int],
                         split: Mapping[str, frozenset[int]] | None = None) -> tuple[int, ...]:
        """Each rank's threads on ``cpus``; ``split``: the steps' blocks of them if not
        ``step_cpus``'s (whole cores: ``whole_cores``)."""
        split = self.step_cpus(cpus) if split is None else split
        if not split:
            return threads_per_rank(cpus, self.local_size)
        sizes = self.ranks_per_step
        return tuple(t for step in sorted(sizes, key=step_order)
                     for t in threads_per_rank(split.get(step, cpus), sizes[step]))

    @property
    def steps_per_s(self) -> dict[int, float]:
        """Steps/s by node cores (ranks x threads), the mean over the ranks: only counts every
        rank has measured."""
        if not self.ranks:
            return {}
        n = len(self.ranks)
        if n == 1:      # one rank (a malleable_tf worker; the simulator's view of a job):
            # its own counts, as floats equal to the mean's (sum([v]) / 1), without the lists
            return {k: v + 0.0 for k, v in self.ranks[0].steps_per_s.items()}
        sums: dict[int, list[float]] = {}
        for r in self.ranks:
            for k, v in r.steps_per_s.items():
                sums.setdefault(k * n, []).append(v)
        return {k: sum(v) / len(v) for k, v in sums.items() if len(v) == n}


SHELL_STEPS = frozenset({"step_batch", "step_interactive", "step_extern"})


def step_order(name: str) -> tuple[int, str]:
    tail = name.rpartition("_")[2]
    return (int(tail), "") if tail.isdigit() else (-1, name)


def split_among_steps(cpus: frozenset[int], ranks_per_step: Mapping[str, int]
                      ) -> dict[str, frozenset[int]]:
    """When ranks of two or more steps of one job run on the node (concurrent sruns), each step's
    folder gets its own block of the job's cores, in proportion to its ranks (the protocol's
    rank split, over the ranks of every step in step order), so the ranks of one step never
    share cores with another's. Empty when one step or none has ranks: every step folder then
    holds all the job's cores (a batch shell waiting on srun uses none)."""
    if len(ranks_per_step) < 2 or not cpus:
        return {}
    units = [step for step in sorted(ranks_per_step, key=step_order)
             for _ in range(ranks_per_step[step])]
    out: dict[str, frozenset[int]] = {}
    for i, step in enumerate(units):
        out[step] = out.get(step, frozenset()) | rank_share(cpus, i, len(units))
    return out


@dataclass(frozen=True)
class SiteLimits:
    """What the site's settings (``AgentConfig``) bound of the jobs' own words. The defaults
    here bound nothing (the pure policy and the simulator); the agent's config sets them."""

    # Cores above their allocations one user's jobs may hold on the node together, whatever
    # they ask (cpus=, min=) or claim (steps/s, weight=). None: no limit; 0: no lending.
    max_borrowed_cpus: int | None = None
    # The largest weight= that counts, in a partition not in ``partition_max_weight``. None:
    # the job's weight counts as given.
    max_weight: int | None = None
    partition_max_weight: Mapping[str, int] = field(default_factory=dict)

    def weight(self, job: "JobView") -> int:
        """The job's weight as the site lets it count: its own weight=, at most its
        partition's maximum (an admin's setting, never the user's)."""
        cap = self.partition_max_weight.get(job.partition, self.max_weight)
        own = job.spec.weight if job.spec is not None else 1
        return max(1, own if cap is None else min(own, cap))

    def borrow_ceiling(self, job: "JobView") -> int | None:
        """The most cores the job may hold on the node (None: no limit of the site's)."""
        if self.max_borrowed_cpus is None:
            return None
        return len(job.allocation) + max(0, self.max_borrowed_cpus)


@dataclass(frozen=True)
class NodeSnapshot:
    node: str
    cpus: frozenset[int]                       # every core of the node Slurm may hand out
    jobs: tuple[JobView, ...]
    # Jobs starting here whose cores are not known yet (the Prolog marked them): until they are,
    # no job may hold cores outside its own allocation.
    pending_starts: tuple[int, ...] = ()
    max_cpus: int | None = None                # the site's limit on a job's cores (per node)
    # Jobs Slurm runs here whose cgroup folder is not where the node's layout says: their cores
    # cannot be verified (cgroups.misplaced_jobs). The Prolog refuses to start a job then.
    problems: tuple[str, ...] = ()
    limits: SiteLimits = SiteLimits()          # the site's bounds on what jobs ask and claim

    def job(self, job_id: int) -> JobView:
        return next(j for j in self.jobs if j.job_id == job_id)

    @property
    def faults(self) -> tuple[str, ...]:
        """The jobs held to their allocation for their own input (``JobView.fault``)."""
        return tuple(f"job {j.job_id}: {j.fault}" for j in self.jobs if j.fault)


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
    # Concurrent steps with ranks: each step folder's block of ``after`` (else every folder
    # holds all of ``after``).
    step_cpus: Mapping[str, frozenset[int]] = field(default_factory=dict)

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


class OutcomeStatus(enum.Enum):
    """What became of one action when the node's executor carried it out."""
    APPLIED = "applied"
    FAILED = "failed"
    CANCELLED = "cancelled"    # needed cores a failed or cancelled action was to release


@dataclass(frozen=True)
class Outcome:
    action: Action
    status: OutcomeStatus
    error: str = ""
    latency_ms: float = 0.0


class PlanInvariantError(Exception):
    """A plan that would give a core to two jobs, leave a job without cores or give cores the
    node has not: a bug in a policy, never acted on. Its own type, not AssertionError, so that
    ``python -O`` and a test's ``pytest.raises(AssertionError)`` cannot confuse it."""


def check_plan(snapshot: NodeSnapshot, plan: Plan) -> None:
    """The rules no plan may break: raise if one does."""
    given: set[int] = set()     # cores of the jobs checked so far
    n_node = len(snapshot.cpus)
    for i, job in enumerate(snapshot.jobs):
        target = plan.targets.get(job.job_id)
        if not target:
            raise PlanInvariantError(f"job {job.job_id} left without cores")
        if not target <= snapshot.cpus:
            raise PlanInvariantError(f"job {job.job_id} given cores outside the node")
        if not given.isdisjoint(target):
            c = min(given & target)
            other = next(j.job_id for j in snapshot.jobs[:i] if c in plan.targets[j.job_id])
            raise PlanInvariantError(f"core {c} given to jobs {other} and {job.job_id}")
        given |= target
        if not job.resizable or job.spec is None:    # resizable: malleable, so it has a spec
            if target != job.allocation:
                raise PlanInvariantError(f"job {job.job_id} moved off its allocation")
            continue
        cap = max(job.spec.max_on(n_node), job.spec.min_cpus)
        if snapshot.max_cpus is not None:
            cap = min(cap, snapshot.max_cpus)
        if len(target) > max(cap, len(job.allocation)):
            raise PlanInvariantError(f"job {job.job_id} above its maximum")
        ceiling = snapshot.limits.borrow_ceiling(job)
        if ceiling is not None and len(target) > ceiling:
            raise PlanInvariantError(f"job {job.job_id} above the site's borrowing limit")
        if snapshot.pending_starts and not target <= job.allocation:
            raise PlanInvariantError(f"job {job.job_id} holds lent cores while a job starts")
        if len(target) < min(job.spec.min_cpus, len(job.allocation)):
            raise PlanInvariantError(f"job {job.job_id} below its minimum")
        if job.requested is None and len(target) < len(job.allocation):
            # Below Slurm's allocation only when its owner asked (cpus=): its time limit
            # stays what it was for the cores it asked Slurm for.
            raise PlanInvariantError(f"job {job.job_id} below its allocation, unasked")
    user_cap = snapshot.limits.max_borrowed_cpus
    if user_cap is not None:
        borrowed: dict[int, int] = {}
        for job in snapshot.jobs:
            if job.resizable:
                borrowed[job.uid] = borrowed.get(job.uid, 0) + \
                    max(0, len(plan.targets[job.job_id]) - len(job.allocation))
        for uid, n in sorted(borrowed.items()):
            if n > user_cap:
                raise PlanInvariantError(f"user {uid}'s jobs borrow {n} cores, above the "
                                         f"site's limit of {user_cap}")
    for a in plan.actions:
        if a.after != plan.targets[a.job_id]:
            raise PlanInvariantError(f"action for job {a.job_id} disagrees with its target")
