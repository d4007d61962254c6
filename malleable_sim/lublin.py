"""The Lublin-Feitelson workload model with Downey's speedup curves. Pure: no clock, no I/O.

U. Lublin and D. G. Feitelson, "The workload on parallel supercomputers: modeling the
characteristics of rigid jobs", J. Parallel Distrib. Comput. 63(11), pp. 1105-1122, 2003. The
fitted values below are those of the authors' own generator, ``m_lublin99.c`` (Uri Lublin and
Dror Feitelson, distributed by the Parallel Workloads Archive,
<https://www.cs.huji.ac.il/labs/parallel/workload/models.html>), read from the copy in
<https://github.com/renatolfc/lublinworkload>, commit 12ab200c4ac507fb73b1500bde93a00771e34312,
``lublinworkload/m_lublin99.c`` (its MODEL PARAMETERS section; the paper's own tables were not
found through the search tools, so each value is the program's, not checked against the paper):

- size: serial with probability ``serial_prob``; otherwise log2(size) is a two-stage uniform
  (``u_low``..``u_med`` with probability ``u_prob``, else ``u_med``..``u_hi``), rounded to an
  integer (a power of two) with probability ``pow2_prob``; size = round(2^log2size).
- runtime: ln(runtime in s) is a hyper-gamma, gamma(a1, b1) with probability p = pa x size + pb
  (clamped to [0, 1]), else gamma(a2, b2) (shape, scale); drawn again above 12 (the program's
  TOO_MUCH_TIME: exp(12) s, about 45 h).
- arrivals: ln(inter-arrival s) is gamma(aarr x arar, barr) (drawn again above 13), spent
  through the day's 48 half-hour buckets, each weighted by the gamma(anum, bnum) cdf over it
  (the daily cycle; the program's CYCLIC_DAY_START = 11, the day starting at 0:00); batch and
  interactive jobs arrive in two such streams, merged.

The program fits a 128-node machine (u_hi = 7 for batch jobs, 5.5 for interactive ones; its
comment: "UHi is the log2 of the maximal size of a job in the system (system's size)", "UMed
should be in [UHi-1.5, UHi-3.5]"). On a cluster of P cores u_hi and u_med keep their distances
below log2 P (``hi_below``, ``med_below``): on 128 cores they are the program's values.

Speedup: A. B. Downey, "A model for speedup of parallel programs", U.C. Berkeley technical
report UCB/CSD-97-933, January 1997 (<https://www2.eecs.berkeley.edu/Pubs/TechRpts/1997/5394.html>),
``Downey``. Its parameters per job: A, the job's size (the Parallel Workloads Archive's page on
Downey's 1997 model: the degree of parallelism "is interpreted as the average parallelism in
the job"), and sigma uniform in [0, 2] (both regimes, half of the jobs each): the distributions
Cirne and Berman later proposed for A and sigma were not found through the search tools, so
this range is this project's choice, stated as such.
"""
from __future__ import annotations

import dataclasses
import enum
import heapq
import math
import random
from dataclasses import dataclass
from typing import Iterator, Sequence

from malleable_policy.request import MalleableSpec
from .workload import Downey, SimJob

SECONDS_PER_BUCKET = 1800.0     # the program's BUCKETS = 48 per day
BUCKETS = 48
CYCLIC_DAY_START = 11
MAX_LN_RUNTIME = 12.0           # TOO_MUCH_TIME
MAX_LN_INTERARRIVAL = 13.0      # TOO_MUCH_ARRIVE_TIME


class JobClass(enum.Enum):
    BATCH = "batch"
    INTERACTIVE = "interactive"


@dataclass(frozen=True)
class LublinClass:
    """One class's fitted parameters (``m_lublin99.c``'s names in the comments)."""

    serial_prob: float      # SERIAL_PROB_*
    pow2_prob: float        # POW2_PROB_*
    u_low: float            # ULOW_*
    med_below: float        # UHI - UMED on the program's 128-node machine
    hi_below: float         # 7 - UHI_*
    u_prob: float           # UPROB_*
    a1: float               # A1_*, B1_*, A2_*, B2_*: the hyper-gamma of ln(runtime)
    b1: float
    a2: float
    b2: float
    pa: float               # PA_*, PB_*: p = pa x size + pb
    pb: float
    aarr: float             # AARR_* x ARAR_*: ln(inter-arrival) ~ gamma(aarr, barr)
    barr: float
    anum: float             # ANUM_*, BNUM_*: the daily cycle
    bnum: float


BATCH = LublinClass(serial_prob=0.2927, pow2_prob=0.6686, u_low=1.2, med_below=2.0,
                    hi_below=0.0, u_prob=0.875, a1=6.57, b1=0.823, a2=639.1, b2=0.0156,
                    pa=-0.003, pb=0.6986, aarr=6.0415 * 1.0519, barr=0.8531, anum=6.1271,
                    bnum=5.2740)
INTERACTIVE = LublinClass(serial_prob=0.1541, pow2_prob=0.625, u_low=1.0, med_below=4.0,
                          hi_below=1.5, u_prob=0.705, a1=3.8351, b1=0.6605, a2=7.073,
                          b2=0.6856, pa=-0.0118, pb=0.9156, aarr=6.5510 * 0.9797, barr=0.6621,
                          anum=8.9186, bnum=3.6680)
CLASSES = {JobClass.BATCH: BATCH, JobClass.INTERACTIVE: INTERACTIVE}


def gamma_cdf(x: float, shape: float, scale: float = 1.0) -> float:
    """P(X <= x) for X ~ gamma(shape, scale): the regularized lower incomplete gamma function,
    by its series below shape + 1 and its continued fraction above (Numerical Recipes' gser and
    gcf, as the program computes it)."""
    if x <= 0:
        return 0.0
    z = x / scale
    log_front = -z + shape * math.log(z) - math.lgamma(shape)
    if z < shape + 1:
        term = total = 1.0 / shape
        a = shape
        for _ in range(1000):
            a += 1
            term *= z / a
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return total * math.exp(log_front)
    # Lentz's method for the continued fraction of the upper tail.
    tiny = 1e-300
    b = z + 1 - shape
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - shape)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return 1.0 - math.exp(log_front) * h


def daily_weights(anum: float, bnum: float) -> tuple[float, ...]:
    """Each half-hour bucket's share of the day's arrivals over the mean share, as the program's
    arrive_init computes them (bucket (i - 1) mod 48 gets the gamma cdf over [i - 0.5, i + 0.5]
    for i from CYCLIC_DAY_START on)."""
    weights = [0.0] * BUCKETS
    for i in range(CYCLIC_DAY_START, BUCKETS + CYCLIC_DAY_START):
        weights[(i - 1) % BUCKETS] = gamma_cdf(i + 0.5, anum, bnum) - gamma_cdf(i - 0.5, anum,
                                                                                bnum)
    mean = sum(weights) / BUCKETS
    return tuple(w / mean for w in weights)


def arrivals(params: LublinClass, rng: random.Random) -> Iterator[float]:
    """One class's arrival times from 0:00 (the program's calc_next_arrive): each draw's
    exp(gamma) seconds are points, spent on the buckets at their weights, so the same draw
    passes a busy half hour (weight above 1) sooner than a quiet one."""
    weights = daily_weights(params.anum, params.bnum)
    t, bucket, points, remainder = 0.0, 0, 0.0, 0.0
    while True:
        yield t
        while True:
            gam = rng.gammavariate(params.aarr, params.barr)
            if gam <= MAX_LN_INTERARRIVAL:
                break
        points += math.exp(gam) / SECONDS_PER_BUCKET
        step = 0.0
        while points > weights[bucket]:
            points -= weights[bucket]
            bucket = (bucket + 1) % BUCKETS
            step += SECONDS_PER_BUCKET
        new_remainder = points / weights[bucket]
        step += SECONDS_PER_BUCKET * (new_remainder - remainder)
        remainder = new_remainder
        t += step


def job_size(params: LublinClass, rng: random.Random, max_size: int) -> int:
    """Serial, power of two or other; log2 of a parallel size from the two-stage uniform with
    u_hi = log2(max_size) - hi_below (the program's calc_number_of_nodes)."""
    u = rng.random()
    if u <= params.serial_prob:
        return 1
    hi = math.log2(max_size) - params.hi_below
    med = math.log2(max_size) - params.med_below
    lo = min(params.u_low, med)
    par = rng.uniform(lo, med) if rng.random() <= params.u_prob else rng.uniform(med, hi)
    if u <= params.serial_prob + params.pow2_prob:
        par = float(int(par + 0.5))
    return max(1, min(max_size, int(2 ** par + 0.5)))


def runtime_s(params: LublinClass, size: int, rng: random.Random) -> float:
    """exp of the hyper-gamma whose first gamma's probability falls with the size (the
    program's time_from_nodes)."""
    p = min(1.0, max(0.0, params.pa * size + params.pb))
    while True:
        a, b = (params.a1, params.b1) if rng.random() <= p else (params.a2, params.b2)
        hg = rng.gammavariate(a, b)
        if hg <= MAX_LN_RUNTIME:
            return math.exp(hg)


@dataclass(frozen=True)
class LublinModel:
    """What the generated workload is: the classes that arrive (both, as the program does by
    default), the share of malleable jobs and how far they may grow, Downey's sigma range."""

    classes: tuple[JobClass, ...] = (JobClass.BATCH, JobClass.INTERACTIVE)
    sigma: tuple[float, float] = (0.0, 2.0)
    malleable_max_factor: int = 4      # a malleable job may grow to this times its allocation


def offered_load(jobs: Sequence[SimJob], capacity: int) -> float:
    """The work offered per unit of capacity while jobs arrive: the sum over jobs of cores x
    (start-up + runtime at that size), over capacity x (last submit - first submit). The
    program's own definition (its header comment: sum(ri x ni) / (P x max(ai)))."""
    if len(jobs) < 2:
        raise ValueError("an offered load needs at least two arrivals")
    first = min(j.submit_s for j in jobs)
    span = max(j.submit_s for j in jobs) - first
    if span <= 0:
        raise ValueError("every job arrives at once: no offered load (a closed batch)")
    return sum(j.cores * j.reference_s for j in jobs) / (capacity * span)


def scale_to_load(jobs: Sequence[SimJob], target: float, capacity: int) -> list[SimJob]:
    """The same jobs with every inter-arrival time multiplied by offered load / target, so that
    ``offered_load`` of the result is ``target``: sizes, runtimes and the arrivals' shape (daily
    cycle, bursts) are kept, only the clock of arrivals is stretched or squeezed."""
    if target <= 0:
        raise ValueError("the target offered load is above 0")
    factor = offered_load(jobs, capacity) / target
    first = min(j.submit_s for j in jobs)
    return [dataclasses.replace(j, submit_s=first + (j.submit_s - first) * factor)
            for j in jobs]


def generate_lublin(n_jobs: int, nodes: int, cores: int, malleable_fraction: float, seed: int,
                    offered: float | None = None,
                    model: LublinModel = LublinModel()) -> list[SimJob]:
    """``n_jobs`` jobs of the Lublin-Feitelson model on ``nodes`` x ``cores`` (sizes up to the
    whole cluster), each with a Downey curve (A = its size); ``malleable_fraction`` of them
    malleable (min 1 core, max ``malleable_max_factor`` x its size within a node, as
    ``generate`` draws them); with ``offered``, arrivals scaled to that offered load
    (``scale_to_load``)."""
    if n_jobs < 1 or nodes < 1 or cores < 1:
        raise ValueError("jobs, nodes and cores must be at least 1")
    if not 0.0 <= malleable_fraction <= 1.0:
        raise ValueError("the malleable fraction is between 0 and 1")
    rng = random.Random(seed)
    capacity = nodes * cores
    # The streams, merged by arrival: the class whose next job arrives first gives the job.
    streams = [(CLASSES[c], arrivals(CLASSES[c], random.Random(rng.random())))
               for c in model.classes]
    heads = [(next(it), k) for k, (_, it) in enumerate(streams)]
    heapq.heapify(heads)
    jobs = []
    for i in range(n_jobs):
        t, k = heapq.heappop(heads)
        heapq.heappush(heads, (next(streams[k][1]), k))
        params = streams[k][0]
        size = job_size(params, rng, capacity)
        run = runtime_s(params, size, rng)
        curve = Downey(float(size), rng.uniform(*model.sigma))
        spec = None
        if rng.random() < malleable_fraction:
            spec = MalleableSpec(min_cpus=1,
                                 max_cpus=min(cores, size * model.malleable_max_factor))
        jobs.append(SimJob(i + 1, round(t, 3), size, round(run, 3), curve, spec))
    return scale_to_load(jobs, offered, capacity) if offered is not None else jobs
