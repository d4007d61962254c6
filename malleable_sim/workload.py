"""What the simulator runs: jobs with a speedup curve, generated or read from a Standard Workload
Format log (swf.py). Pure: no clock, no I/O."""
from __future__ import annotations

import bisect
import dataclasses
import enum
import math
import random
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Protocol, Sequence

from malleable_policy.request import MalleableSpec
from .swf import CANCELLED, PARTIAL_STATUSES, SWFLog, SWFRecord


class Speedup(Protocol):
    def rate(self, cores: int) -> float:
        """Work done per second on ``cores`` cores (1.0 at one core)."""


@dataclass(frozen=True)
class Amdahl:
    """Amdahl's law with a communication term: time(n)/time(1) = s + (1-s)/n + c(n-1).
    Beyond n* = sqrt((1-s)/c) more cores slow the job down."""

    serial: float = 0.05
    comm: float = 0.0

    def rate(self, cores: int) -> float:
        n = max(1, cores)
        return 1.0 / (self.serial + (1.0 - self.serial) / n + self.comm * (n - 1))


@dataclass(frozen=True)
class Measured:
    """Steps/s measured at some core counts (telemetry of a real run), normalised so that the
    rate at the fewest measured cores, scaled linearly down to one core, is per-core 1.0;
    linear in between, flat beyond the last point."""

    points: tuple[tuple[int, float], ...]

    @classmethod
    def from_steps_per_s(cls, steps: Mapping[int, float]) -> "Measured":
        pts = sorted((int(k), float(v)) for k, v in steps.items() if int(k) > 0 and v > 0)
        if not pts:
            raise ValueError("a measured curve needs at least one point with steps/s > 0")
        base = pts[0][1] / pts[0][0]
        return cls(tuple((k, v / base) for k, v in pts))

    def rate(self, cores: int) -> float:
        pts = self.points
        if cores <= pts[0][0]:
            return pts[0][1] * max(1, cores) / pts[0][0]
        for (k0, v0), (k1, v1) in zip(pts, pts[1:]):
            if cores <= k1:
                return v0 + (v1 - v0) * (cores - k0) / (k1 - k0)
        return pts[-1][1]


@dataclass(frozen=True)
class Downey:
    """Downey's speedup S(n) of a program of average parallelism A and variance in parallelism
    sigma (1.0 at one core; flat at A beyond the widest useful width).

    low variance (sigma <= 1):  A n / (A + sigma (n - 1) / 2)              1 <= n <= A
                                A n / (sigma (A - 1/2) + n (1 - sigma/2))  A <= n <= 2A - 1
                                A                                          n >= 2A - 1
    high variance (sigma >= 1): n A (sigma + 1) / (sigma (n + A - 1) + A)  1 <= n <= A + A sigma
                                                                           - sigma
                                A                                          beyond
    """

    average_parallelism: float
    sigma: float

    def __post_init__(self) -> None:
        if self.average_parallelism < 1 or self.sigma < 0:
            raise ValueError("Downey's model needs A >= 1 and sigma >= 0")

    def rate(self, cores: int) -> float:
        a, s, n = self.average_parallelism, self.sigma, max(1, cores)
        if s <= 1.0:
            if n <= a:
                return a * n / (a + s * (n - 1) / 2)
            if n <= 2 * a - 1:
                return a * n / (s * (a - 0.5) + n * (1 - s / 2))
            return a
        if n <= a + a * s - s:
            return n * a * (s + 1) / (s * (n + a - 1) + a)
        return a


class SpeedupModel(enum.Enum):
    """How a job's speedup curve is drawn, for a trace's jobs and the project's generated ones
    (``malleable-sim --speedup``). Users ask for sizes at which their programs run reasonably:
    the default makes each job's parallel efficiency at its requested size plausible."""

    # Amdahl's law whose serial share gives an efficiency drawn from EFFICIENCY_AT_REQUEST at
    # the requested size (a one-core request: at two cores), no communication term.
    CALIBRATED = "calibrated"
    # Downey's model with A = the requested size (as the Lublin-Feitelson workload has it),
    # sigma from LublinModel's range: efficiency at the request between about 0.6 and 1.
    DOWNEY = "downey"
    # The evaluation's second round: serial share and communication drawn whatever the size
    # (WorkloadModel's ranges). Wide jobs then run at a few percent efficiency at their
    # request, and shrinking them is nearly free: kept as a sensitivity case only.
    ROUND2 = "round2"


EFFICIENCY_AT_REQUEST = (0.5, 0.9)
DOWNEY_SIGMA = (0.0, 2.0)


def draw_speedup(model: SpeedupModel, size: int, rng: random.Random,
                 workload: "WorkloadModel") -> Speedup:
    """One job's curve, for a request of ``size`` cores."""
    if model is SpeedupModel.CALIBRATED:
        efficiency = rng.uniform(*EFFICIENCY_AT_REQUEST)
        n = max(2, size)
        # Amdahl without communication: efficiency(n) = 1 / (n s + 1 - s), solved for s.
        return Amdahl((1.0 / efficiency - 1.0) / (n - 1), 0.0)
    if model is SpeedupModel.DOWNEY:
        return Downey(float(max(1, size)), rng.uniform(*DOWNEY_SIGMA))
    return Amdahl(rng.uniform(*workload.serial_fraction), rng.uniform(*workload.comm))


def efficiency_at_request(jobs: Iterable["SimJob"]) -> float:
    """The core-second-weighted mean parallel efficiency of the jobs at their requested size
    (speedup there / cores; weights: cores x runtime at that size): how well the users' own
    choice of size uses the cores, under the speedup model. nan without jobs."""
    num = den = 0.0
    for j in jobs:
        weight = j.cores * j.runtime_s
        num += weight * j.speedup.rate(j.cores) / max(1, j.cores)
        den += weight
    return num / den if den > 0 else float("nan")


@dataclass(frozen=True)
class SimJob:
    job_id: int
    submit_s: float
    cores: int                        # what it asks Slurm for, in all (over its nodes)
    runtime_s: float                  # at its allocation, after start-up
    speedup: Speedup
    spec: MalleableSpec | None = None  # None: rigid
    startup_s: float = 0.0            # before any work: launch, imports (no faster on more cores)
    time_limit_s: float | None = None  # what backfill sees; None: start-up + runtime (exact)
    # Start-up and runtime at the size its user would ask for in full (``ask_share`` sets it):
    # what bounded slowdown divides by, the same in every regime.
    at_size_s: float | None = None

    @property
    def expected_s(self) -> float:
        """Its time limit: how long Slurm expects it to hold its allocation."""
        return self.time_limit_s if self.time_limit_s is not None else \
            self.startup_s + self.runtime_s

    @property
    def reference_s(self) -> float:
        """Start-up and runtime at its requested size (bounded slowdown's denominator)."""
        return self.at_size_s if self.at_size_s is not None else self.startup_s + self.runtime_s

    @property
    def work(self) -> float:
        """Work units: what the job must get done (rate x seconds)."""
        return self.runtime_s * self.speedup.rate(self.cores)

    def fewest_nodes(self, node_cores: int) -> int:
        return -(-self.cores // node_cores)

    def max_cores(self, node_cores: int) -> int:
        """The widest it runs: on its fewest nodes, each at its per-node maximum."""
        if self.spec is None:
            return self.cores
        return max(self.cores, self.fewest_nodes(node_cores) * self.spec.max_on(node_cores))

    def min_cores(self, node_cores: int) -> int:
        if self.spec is None:
            return self.cores
        return min(self.fewest_nodes(node_cores) * self.spec.min_cpus, self.cores)


@dataclass(frozen=True)
class WorkloadModel:
    """A synthetic workload with the structure commonly reported for HPC logs (and modelled by
    Lublin and Feitelson): a share of serial jobs, sizes log-uniform with a preference for
    powers of two, log-normal runtimes, Poisson arrivals. The parameters are this project's own
    defaults, not the published model's fitted values."""

    serial_share: float = 0.25
    power_of_two_share: float = 0.75
    runtime_median_s: float = 900.0
    runtime_sigma: float = 1.2
    runtime_max_s: float = 86_400.0
    offered_load: float = 1.2          # work arriving per unit of capacity while jobs arrive
    serial_fraction: tuple[float, float] = (0.01, 0.15)
    comm: tuple[float, float] = (0.0, 0.002)
    malleable_max_factor: int = 4      # a malleable job may grow to this times its allocation


def generate(n_jobs: int, nodes: int, cores: int, malleable_fraction: float, seed: int,
             model: WorkloadModel = WorkloadModel(),
             speedup: SpeedupModel = SpeedupModel.CALIBRATED) -> list[SimJob]:
    if n_jobs < 1 or nodes < 1 or cores < 1:
        raise ValueError("jobs, nodes and cores must be at least 1")
    if not 0.0 <= malleable_fraction <= 1.0:
        raise ValueError("the malleable fraction is between 0 and 1")
    rng = random.Random(seed)
    top = math.log2(cores)
    shapes = []
    for _ in range(n_jobs):
        if rng.random() < model.serial_share:
            size = 1
        else:
            size = 2 ** rng.uniform(0.0, top)
            size = 2 ** round(math.log2(size)) if rng.random() < model.power_of_two_share \
                else round(size)
        size = max(1, min(cores, int(size)))
        runtime = min(model.runtime_max_s,
                      rng.lognormvariate(math.log(model.runtime_median_s), model.runtime_sigma))
        shapes.append((size, max(1.0, runtime)))
    mean_core_s = sum(s * r for s, r in shapes) / n_jobs
    arrival_rate = model.offered_load * nodes * cores / mean_core_s   # jobs per second
    t, out = 0.0, []
    for i, (size, runtime) in enumerate(shapes):
        t += rng.expovariate(arrival_rate)
        curve = draw_speedup(speedup, size, rng, model)
        spec = None
        if rng.random() < malleable_fraction:
            spec = MalleableSpec(min_cpus=1, max_cpus=min(cores, size * model.malleable_max_factor))
        out.append(SimJob(i + 1, round(t, 3), size, round(runtime, 3), curve, spec))
    return out


class DropReason(enum.Enum):
    """Why a line of a log is not simulated (the first that applies, in this order)."""

    # A checkpointed or swapped job's partial execution: its summary line is the job.
    PARTIAL_EXECUTION = "partial_execution_record"
    CANCELLED_BEFORE_START = "cancelled_before_start"  # status 5 and no run time
    NO_RUNTIME = "no_runtime"                # run time unknown (-1)
    NO_SUBMIT_TIME = "no_submit_time"
    NO_PROCESSORS = "no_processors"          # neither requested nor allocated processors known
    WIDER_THAN_CLUSTER = "wider_than_cluster"


class Adjustment(enum.Enum):
    """What a simulated job of a log took from elsewhere than its own field."""

    # No requested time: its limit from its run time (``MissingLimit`` says how).
    TIME_LIMIT_FROM_RUNTIME = "time_limit_from_runtime"
    TIME_LIMIT_RAISED_TO_RUNTIME = "time_limit_raised_to_runtime"   # it ran past its limit
    PROCESSORS_FROM_ALLOCATED = "processors_from_allocated"   # no requested processors


@dataclass(frozen=True)
class Workload:
    """The jobs to simulate, and what became of the rest: every line of a log is either a job
    here or counted once in ``dropped``."""

    jobs: tuple[SimJob, ...]
    dropped: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: {r.value: 0 for r in DropReason})
    adjusted: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: {a.value: 0 for a in Adjustment})

    @property
    def read(self) -> int:
        return len(self.jobs) + sum(self.dropped.values())


# The time limits users ask for, where a log records none (NASA's iPSC log, two thirds of
# Thunder's jobs, a sixth of Atlas's). Users pick from a few round values (Tsafrir, Etsion and
# Feitelson, "Modeling User Runtime Estimates", JSSPP 2005: about 20 values make up 90% of the
# requests). These are the values among the 20 most requested in at least two of the four logs
# here that record requests (KTH, Thunder, Blue, Atlas; tests/unit/sim/test_pwa_traces.py
# derives them again from the logs).
POPULAR_LIMITS_S = (60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800, 14400, 21600, 28800,
                    36000, 43200)


class MissingLimit(enum.Enum):
    """The time limit of a job whose log records no requested time."""

    RUN_TIME = "run_time"    # its run time exactly: any delay once it runs kills it
    POPULAR = "popular"      # the popular limit its run fits in (``limit_users_would_ask``)


def limit_users_would_ask(run_s: float) -> float:
    """The tightest limit a user choosing among the popular values gives a job that runs
    ``run_s``: the smallest of them that the run fits in; past the largest, the run rounded up
    to whole hours. Tight on purpose: real requests are looser (the median request is 2.4 times
    the run on KTH, 7 on Blue), and a looser limit favours no regime over another."""
    i = bisect.bisect_left(POPULAR_LIMITS_S, run_s)
    return float(POPULAR_LIMITS_S[i]) if i < len(POPULAR_LIMITS_S) else \
        3600.0 * math.ceil(run_s / 3600.0)


def _drop_reason(rec: SWFRecord, capacity: int) -> DropReason | None:
    if rec.status in PARTIAL_STATUSES:
        return DropReason.PARTIAL_EXECUTION
    if rec.status == CANCELLED and rec.run_s <= 0:
        return DropReason.CANCELLED_BEFORE_START
    if rec.run_s < 0:
        return DropReason.NO_RUNTIME     # 0 is a run under half a second: it ran
    if rec.submit_s < 0:
        return DropReason.NO_SUBMIT_TIME
    procs = rec.requested_procs if rec.requested_procs > 0 else rec.allocated_procs
    if procs <= 0:
        return DropReason.NO_PROCESSORS
    if procs > capacity:
        return DropReason.WIDER_THAN_CLUSTER
    return None


def swf_workload(log: SWFLog, *, nodes: int, cores: int, malleable_fraction: float = 0.0,
                 seed: int = 0, model: WorkloadModel = WorkloadModel(),
                 first: int | None = None,
                 speedup: SpeedupModel = SpeedupModel.CALIBRATED,
                 missing_limit: MissingLimit = MissingLimit.RUN_TIME) -> Workload:
    """The jobs of a log (its ``first`` lines, or all) on ``nodes`` x ``cores``: submitted when
    the log says, asking for the requested processors (field 8; the allocated ones, field 5,
    where it is unknown), running for the log's run time, with the requested time (field 9) as
    the time limit backfill plans with (where none was requested, ``missing_limit`` says which;
    the run time where the job ran past its request). A speedup curve (``speedup``:
    ``draw_speedup``) and, for ``malleable_fraction`` of the jobs, malleability are drawn as in
    ``generate``."""
    rng = random.Random(seed)
    dropped = {r.value: 0 for r in DropReason}
    adjusted = {a.value: 0 for a in Adjustment}
    jobs = []
    for rec in log.records[:first]:
        reason = _drop_reason(rec, nodes * cores)
        if reason is not None:
            dropped[reason.value] += 1
            continue
        procs = rec.requested_procs
        if procs <= 0:
            procs = rec.allocated_procs
            adjusted[Adjustment.PROCESSORS_FROM_ALLOCATED.value] += 1
        limit = rec.requested_time_s
        if limit <= 0:
            limit = rec.run_s if missing_limit is MissingLimit.RUN_TIME else \
                limit_users_would_ask(rec.run_s)
            adjusted[Adjustment.TIME_LIMIT_FROM_RUNTIME.value] += 1
        elif limit < rec.run_s:
            limit = rec.run_s
            adjusted[Adjustment.TIME_LIMIT_RAISED_TO_RUNTIME.value] += 1
        curve = draw_speedup(speedup, procs, rng, model)
        spec = None
        if rng.random() < malleable_fraction:
            spec = MalleableSpec(min_cpus=1,
                                 max_cpus=min(cores, procs * model.malleable_max_factor))
        jobs.append(SimJob(rec.job, rec.submit_s, procs, rec.run_s, curve, spec,
                           time_limit_s=limit))
    return Workload(tuple(sorted(jobs, key=lambda j: (j.submit_s, j.job_id))), dropped, adjusted)


def ask_share(jobs: Iterable[SimJob], share: float, node_cores: int) -> list[SimJob]:
    """The same jobs, each malleable one that fits a node asking Slurm for ``share`` of its
    cores (rounded down, at least its min and 1) and growing from there: a smaller guarantee
    that Slurm can place sooner and pack tighter, with the same work and the same maximum, and a
    time limit longer in proportion. Rigid jobs are unchanged, and so are jobs wider than a
    node: their nodes are full, so no agent could grow them back (their node count would have
    to grow)."""
    if not 0.0 < share <= 1.0:
        raise ValueError("the share a malleable job asks for is in (0, 1]")
    out = []
    for j in jobs:
        if j.spec is None or share == 1.0 or j.cores > node_cores:
            out.append(j)
            continue
        ask = min(j.cores, max(1, j.spec.min_cpus, math.floor(j.cores * share)))
        # The maximum stays what it was: at least the size the job would have asked for.
        spec = j.spec if j.spec.max_cpus is None else \
            dataclasses.replace(j.spec, max_cpus=max(j.cores, j.spec.max_cpus))
        runtime = j.work / j.speedup.rate(ask)
        limit, before = j.time_limit_s, j.startup_s + j.runtime_s
        if limit is not None and before > 0:
            limit *= (j.startup_s + runtime) / before   # the same margin over a longer run
        out.append(dataclasses.replace(j, cores=ask, runtime_s=runtime, spec=spec,
                                       time_limit_s=limit, at_size_s=j.reference_s))
    return out


def efficacy(speedup: Speedup, cores: int) -> float:
    """Speedup times efficiency, S(n)^2 / n: largest at the processor working set (Ghosal,
    Serazzi and Tripathi, 1991), the knee where more cores stop paying for themselves."""
    return speedup.rate(cores) ** 2 / max(1, cores)


def moldable_size(job: SimJob, node_cores: int) -> int:
    """The fixed size an oracle that knows the job's speedup curve gives it: the size up to
    the one its user asked for (in whole nodes for a job wider than a node) with the largest
    efficacy (``efficacy``); the larger of equal ones."""
    if job.cores <= node_cores:
        sizes = range(1, job.cores + 1)
    else:
        sizes = range(node_cores, job.cores + 1, node_cores)
    return max(sizes, key=lambda n: (round(efficacy(job.speedup, n), 12), n))


def moldable(jobs: Iterable[SimJob], node_cores: int) -> list[SimJob]:
    """The same jobs, each malleable one asking Slurm for its ``moldable_size`` and running
    there, fixed (no agent, no resize): what a speedup model gives for free without
    malleability. Its time limit keeps the same margin over its run; rigid jobs are
    unchanged."""
    out = []
    for j in jobs:
        size = moldable_size(j, node_cores) if j.spec is not None else j.cores
        if size == j.cores:
            out.append(j)
            continue
        runtime = j.work / j.speedup.rate(size)
        limit, before = j.time_limit_s, j.startup_s + j.runtime_s
        if limit is not None and before > 0:
            limit *= (j.startup_s + runtime) / before
        out.append(dataclasses.replace(j, cores=size, runtime_s=runtime, time_limit_s=limit,
                                       at_size_s=j.reference_s))
    return out


def closed_batch(jobs: Iterable[SimJob]) -> list[SimJob]:
    """The same jobs all submitted at once, at 0 (a closed batch, as DMR is evaluated): the
    queue then holds them in their order (submission order breaks ties: the log's)."""
    return [dataclasses.replace(j, submit_s=0.0) for j in jobs]


def time_cost_frontier(speedup: Speedup, lo: int, hi: int) -> tuple[tuple[float, float], ...]:
    """Per unit of work, the (seconds, core-seconds) a job can trade between, run at widths
    lo..hi: the lower convex hull of the points (1/rate(n), n/rate(n)), from the fastest point
    to the cheapest. A job whose width changes while it runs does each part of its work at one
    width, so its (time, cost) per unit is a mix of the points and lies on or above this hull;
    waiting adds time and no cost. Seconds ascending, core-seconds descending."""
    pts = sorted((1.0 / speedup.rate(n), n / speedup.rate(n)) for n in range(lo, hi + 1))
    hull: list[tuple[float, float]] = []
    for p in pts:
        if hull and p[1] >= hull[-1][1]:
            continue   # no faster and no cheaper than a point kept: never worth running at
        # Drop the last point while it lies on or above the chord from the one before it to p.
        while len(hull) >= 2 and ((hull[-1][0] - hull[-2][0]) * (p[1] - hull[-2][1]) -
                                  (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0])) <= 0:
            hull.pop()
        hull.append(p)
    return tuple(hull)


def _least_cost_within(frontier: Sequence[tuple[float, float]], per_unit_s: float) -> float:
    """The fewest core-seconds per unit of work when each unit may take ``per_unit_s``;
    infinite below the fastest point."""
    if per_unit_s < frontier[0][0] * (1 - 1e-12):
        return math.inf
    if per_unit_s <= frontier[0][0]:
        return frontier[0][1]
    if per_unit_s >= frontier[-1][0]:
        return frontier[-1][1]
    i = bisect.bisect_right(frontier, per_unit_s, key=lambda p: p[0])
    (x0, y0), (x1, y1) = frontier[i - 1], frontier[i]
    return y0 + (y1 - y0) * (per_unit_s - x0) / (x1 - x0)


def fluid_lower_bound(jobs: Iterable[SimJob], nodes: int, cores: int,
                      rel_tol: float = 1e-5,
                      widths: Callable[[SimJob], tuple[int, int]] | None = None) -> float:
    """A makespan no schedule can beat, from the first arrival: the earliest end E of a fluid
    schedule (any job may use any share of the whole cluster's cores, within its widths
    min..max) in which every job, started at its arrival plus its start-up, ends by E. A job's
    core-seconds depend on E: the less time it has, the wider (and costlier, by its speedup
    curve) it must run (``time_cost_frontier``); the work that arrives from any instant on must
    fit the cores from that instant to E. E is found by bisection; the value returned is never
    above the true one (the last E found infeasible, or the simple bound below).

    The simple bound (every job at its least core-seconds, and separately no job faster than at
    its best width) is the starting point: it asked each long job to be both as cheap as at one
    core and as fast as at its widest, which no schedule can be."""
    jobs = sorted(jobs, key=lambda j: j.submit_s)
    if not jobs:
        return 0.0
    capacity = nodes * cores
    first = jobs[0].submit_s
    # Each job's narrowest and widest (``widths``: a regime that moves node counts).
    span = widths or (lambda j: (j.min_cores(cores), j.max_cores(cores)))
    fronts = [time_cost_frontier(j.speedup, *span(j)) for j in jobs]
    works = [j.work for j in jobs]
    ready = [j.submit_s + j.startup_s for j in jobs]

    def feasible(end: float) -> bool:
        suffix = 0.0
        for k in range(len(jobs) - 1, -1, -1):
            if works[k] > 0:     # a log's run time of 0 (under half a second) costs nothing
                suffix += works[k] * _least_cost_within(fronts[k], (end - ready[k]) / works[k])
            if jobs[k].submit_s + suffix / capacity > end * (1 + 1e-12):
                return False
        return True

    # The simple bound: least core-seconds from each arrival on, and each job at its fastest.
    suffix, low = 0.0, first
    for k in range(len(jobs) - 1, -1, -1):
        suffix += works[k] * fronts[k][-1][1]
        low = max(low, jobs[k].submit_s + suffix / capacity,
                  ready[k] + works[k] * fronts[k][0][0])
    if feasible(low):
        return low - first
    high = low + max(1.0, low - first)
    while not feasible(high):
        low, high = high, high + 2 * (high - first)
    while high - low > rel_tol * max(1.0, high - first):
        mid = (low + high) / 2
        if feasible(mid):
            high = mid
        else:
            low = mid
    return low - first
