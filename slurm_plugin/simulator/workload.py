"""What the simulator runs: jobs with a speedup curve, generated or read from a Standard Workload
Format file. Pure: no clock, no I/O beyond reading the SWF text handed in."""
from __future__ import annotations

import bisect
import dataclasses
import math
import random
from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol, Sequence

from ..coscheduler.request import MalleableSpec


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
class SimJob:
    job_id: int
    submit_s: float
    cores: int                        # Slurm's allocation on its node (single-node jobs)
    runtime_s: float                  # at its allocation, after start-up
    speedup: Speedup
    spec: MalleableSpec | None = None  # None: rigid
    startup_s: float = 0.0            # before any work: launch, imports (no faster on more cores)

    @property
    def expected_s(self) -> float:
        """Start-up and runtime at its allocation: what its time limit tells Slurm."""
        return self.startup_s + self.runtime_s

    @property
    def work(self) -> float:
        """Work units: what the job must get done (rate x seconds)."""
        return self.runtime_s * self.speedup.rate(self.cores)

    def max_cores(self, node_cores: int) -> int:
        return self.cores if self.spec is None else max(self.cores,
                                                        self.spec.max_on(node_cores))

    def min_cores(self, node_cores: int) -> int:
        return self.cores if self.spec is None else min(self.spec.min_cpus, self.cores)


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
             model: WorkloadModel = WorkloadModel()) -> list[SimJob]:
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
        curve = Amdahl(rng.uniform(*model.serial_fraction), rng.uniform(*model.comm))
        spec = None
        if rng.random() < malleable_fraction:
            spec = MalleableSpec(min_cpus=1, max_cpus=min(cores, size * model.malleable_max_factor))
        out.append(SimJob(i + 1, round(t, 3), size, round(runtime, 3), curve, spec))
    return out


class SWFError(ValueError):
    pass


def parse_swf(text: str, *, cores: int, malleable_fraction: float = 0.0, seed: int = 0,
              model: WorkloadModel = WorkloadModel()) -> list[SimJob]:
    """Jobs of a Standard Workload Format log: field 1 job number, 2 submit time, 4 run time,
    5 allocated processors (8, requested processors, where 5 is -1). Lines starting with ';' are
    the header. Jobs that did not run (run time or processors <= 0) are left out; processors above
    ``cores`` are capped to one node (this simulator places single-node jobs). A speedup curve
    and, for ``malleable_fraction`` of the jobs, malleability are drawn as in ``generate``."""
    rng = random.Random(seed)
    jobs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(";"):
            continue
        fields = line.split()
        if len(fields) < 8:
            raise SWFError(f"line {lineno}: {len(fields)} fields, an SWF line has 18")
        try:
            job, submit, run = int(fields[0]), float(fields[1]), float(fields[3])
            procs = int(fields[4]) if int(fields[4]) > 0 else int(fields[7])
        except ValueError as exc:
            raise SWFError(f"line {lineno}: {exc}") from None
        if run <= 0 or procs <= 0:
            continue
        size = min(cores, procs)
        curve = Amdahl(rng.uniform(*model.serial_fraction), rng.uniform(*model.comm))
        spec = None
        if rng.random() < malleable_fraction:
            spec = MalleableSpec(min_cpus=1, max_cpus=min(cores, size * model.malleable_max_factor))
        jobs.append(SimJob(job, submit, size, run, curve, spec))
    if not jobs:
        raise SWFError("no job that ran in this SWF text")
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def ask_share(jobs: Iterable[SimJob], share: float) -> list[SimJob]:
    """The same jobs, each malleable one asking Slurm for ``share`` of its cores (rounded down, at
    least its min and 1) and growing from there: a smaller guarantee that Slurm can place sooner
    and pack tighter, with the same work and the same maximum. Rigid jobs are unchanged."""
    if not 0.0 < share <= 1.0:
        raise ValueError("the share a malleable job asks for is in (0, 1]")
    out = []
    for j in jobs:
        if j.spec is None or share == 1.0:
            out.append(j)
            continue
        ask = min(j.cores, max(1, j.spec.min_cpus, math.floor(j.cores * share)))
        # The maximum stays what it was: at least the size the job would have asked for.
        spec = j.spec if j.spec.max_cpus is None else \
            dataclasses.replace(j.spec, max_cpus=max(j.cores, j.spec.max_cpus))
        out.append(dataclasses.replace(j, cores=ask, runtime_s=j.work / j.speedup.rate(ask),
                                       spec=spec))
    return out


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
                      rel_tol: float = 1e-5) -> float:
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
    fronts = [time_cost_frontier(j.speedup, j.min_cores(cores), j.max_cores(cores))
              for j in jobs]
    works = [j.work for j in jobs]
    ready = [j.submit_s + j.startup_s for j in jobs]

    def feasible(end: float) -> bool:
        suffix = 0.0
        for k in range(len(jobs) - 1, -1, -1):
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
