"""The Lublin-Feitelson workload, Downey's speedup curves and offered load (pure)."""
from __future__ import annotations

import math
import random
import statistics

import pytest

from malleable_sim import SimJob, SimPolicy, simulate
from malleable_sim.lublin import (BATCH, BUCKETS, INTERACTIVE, Downey, JobClass,
                                           LublinModel, arrivals, daily_weights, gamma_cdf,
                                           generate_lublin, job_size, offered_load, runtime_s,
                                           scale_to_load)


def test_downey_low_variance_regime():
    d = Downey(average_parallelism=8.0, sigma=0.5)
    assert d.rate(1) == pytest.approx(1.0)
    assert d.rate(4) == pytest.approx(8 * 4 / (8 + 0.5 * 3 / 2))
    assert d.rate(12) == pytest.approx(8 * 12 / (0.5 * 7.5 + 12 * 0.75))
    assert d.rate(15) == pytest.approx(8.0) and d.rate(64) == 8.0       # 2A - 1 = 15
    # sigma = 0: linear up to A, then flat.
    assert Downey(8.0, 0.0).rate(8) == pytest.approx(8.0)
    assert Downey(8.0, 0.0).rate(9) == pytest.approx(8.0)


def test_downey_high_variance_regime_and_continuity():
    d = Downey(average_parallelism=8.0, sigma=2.0)
    assert d.rate(1) == pytest.approx(1.0)
    assert d.rate(5) == pytest.approx(5 * 8 * 3 / (2 * 12 + 8))
    knee = 8 + 8 * 2 - 2                                                    # A + A sigma - sigma
    assert d.rate(knee) == pytest.approx(8.0) and d.rate(knee + 10) == 8.0
    # At sigma = 1 both regimes give the same curve, and every curve rises to A.
    for n in range(1, 40):
        lo = Downey(8.0, 1.0).rate(n)
        hi = 8 * n * 2 / ((n + 7) + 8) if n <= 15 else 8.0
        assert lo == pytest.approx(hi)
    for sigma in (0.0, 0.3, 1.0, 1.7):
        rates = [Downey(16.0, sigma).rate(n) for n in range(1, 80)]
        assert all(b >= a - 1e-9 for a, b in zip(rates, rates[1:]))
        assert rates[-1] == pytest.approx(16.0)
    with pytest.raises(ValueError):
        Downey(0.5, 1.0)


def test_gamma_cdf_against_known_values():
    for x in (0.1, 1.0, 3.0, 10.0):
        assert gamma_cdf(x, 1.0) == pytest.approx(1 - math.exp(-x))      # exponential
        assert gamma_cdf(x, 2.0) == pytest.approx(1 - math.exp(-x) * (1 + x))
    assert gamma_cdf(4.0, 2.0, scale=2.0) == pytest.approx(gamma_cdf(2.0, 2.0))
    assert gamma_cdf(0.0, 3.0) == 0.0
    scipy = pytest.importorskip("scipy.special")
    for a, x in ((6.1271, 20.0), (8.1737, 3.0), (0.5, 0.1), (50.0, 60.0)):
        assert gamma_cdf(x, a) == pytest.approx(float(scipy.gammainc(a, x)), rel=1e-9)


def test_the_daily_cycle_peaks_in_the_day_and_averages_one():
    w = daily_weights(BATCH.anum, BATCH.bnum)
    assert len(w) == BUCKETS and sum(w) / BUCKETS == pytest.approx(1.0)
    peak = w.index(max(w))
    assert 20 <= peak <= 32           # between 10:00 and 16:00
    assert min(w) < 0.3 < 1.5 < max(w)


def test_arrivals_follow_the_cycle():
    rng = random.Random(3)
    it = arrivals(BATCH, rng)
    times = [next(it) for _ in range(20_000)]
    assert times == sorted(times) and times[0] == 0.0
    by_half_hour = [0] * BUCKETS
    for t in times:
        by_half_hour[int(t % 86_400 // 1800)] += 1
    w = daily_weights(BATCH.anum, BATCH.bnum)
    busy, quiet = w.index(max(w)), w.index(min(w))
    assert by_half_hour[busy] > 3 * by_half_hour[quiet]


def test_job_sizes_match_the_fitted_shares():
    rng = random.Random(5)
    sizes = [job_size(BATCH, rng, 128) for _ in range(40_000)]
    assert statistics.mean(s == 1 for s in sizes) == pytest.approx(BATCH.serial_prob, abs=0.01)
    parallel = [s for s in sizes if s > 1]
    pow2 = sum(s & (s - 1) == 0 for s in parallel) / len(sizes)
    # Powers of two: the rounded ones, and the others that land on one by chance.
    assert pow2 >= BATCH.pow2_prob - 0.01
    assert max(sizes) <= 128 and min(sizes) >= 1
    # Interactive jobs are smaller: u_hi 1.5 below log2 of the machine.
    inter = [job_size(INTERACTIVE, rng, 128) for _ in range(20_000)]
    assert max(inter) <= round(2 ** 5.5) and statistics.mean(inter) < statistics.mean(sizes)


def test_runtimes_lengthen_with_size():
    rng = random.Random(7)
    small = [runtime_s(BATCH, 1, rng) for _ in range(20_000)]
    wide = [runtime_s(BATCH, 200, rng) for _ in range(20_000)]    # p = 0.0986
    assert max(small + wide) <= math.exp(12)
    assert statistics.median(wide) > 5 * statistics.median(small)
    # Size 1: p = 0.6956 of the short gamma (mean ln 5.4 s: about 220 s), of which the part
    # below ln 8; the long gamma (mean ln 9.97 s, sd 0.39) is never that short.
    short = sum(r < math.exp(8) for r in small) / len(small)
    assert short == pytest.approx(0.6956 * gamma_cdf(8.0, BATCH.a1, BATCH.b1), abs=0.015)


def test_offered_load_and_scaling_to_a_target():
    from malleable_sim import Amdahl
    linear = Amdahl(0.0, 0.0)
    jobs = [SimJob(1, 0.0, 2, 100.0, linear), SimJob(2, 50.0, 4, 50.0, linear),
            SimJob(3, 100.0, 1, 200.0, linear)]
    assert offered_load(jobs, 8) == pytest.approx((200 + 200 + 200) / (8 * 100))
    scaled = scale_to_load(jobs, 1.5, 8)
    assert [j.submit_s for j in scaled] == pytest.approx([0.0, 25.0, 50.0])
    assert offered_load(scaled, 8) == pytest.approx(1.5)
    assert [(j.cores, j.runtime_s) for j in scaled] == [(j.cores, j.runtime_s) for j in jobs]
    with pytest.raises(ValueError):
        offered_load([jobs[0]], 8)
    with pytest.raises(ValueError):
        scale_to_load(jobs, 0.0, 8)


def test_generate_lublin_reaches_the_load_and_is_reproducible():
    jobs = generate_lublin(3000, 16, 16, 0.5, 2, offered=0.85)
    assert offered_load(jobs, 256) == pytest.approx(0.85)
    assert jobs == generate_lublin(3000, 16, 16, 0.5, 2, offered=0.85)
    assert jobs != generate_lublin(3000, 16, 16, 0.5, 3, offered=0.85)
    assert all(1 <= j.cores <= 256 for j in jobs)
    assert all(isinstance(j.speedup, Downey) and j.speedup.average_parallelism == j.cores
               for j in jobs)
    assert statistics.mean(j.spec is not None for j in jobs) == pytest.approx(0.5, abs=0.04)
    sigmas = [j.speedup.sigma for j in jobs]
    assert 0.0 <= min(sigmas) and max(sigmas) <= 2.0
    assert 0.4 < statistics.mean(s <= 1 for s in sigmas) < 0.6          # both regimes
    batch_only = generate_lublin(500, 16, 16, 0.0, 2, model=LublinModel((JobClass.BATCH,)))
    assert all(j.spec is None for j in batch_only)
    r = simulate(jobs[:400], nodes=16, cores=16, policy=SimPolicy.STATIC)
    assert r.jobs == 400


def test_the_command_line_generates_lublin_and_scales_a_log(tmp_path):
    import json

    from malleable_sim.cli import main
    out = tmp_path / "out.json"
    assert main(["--nodes", "4", "--cores", "16", "--jobs", "200", "--workload",
                 "lublin", "--offered-load", "0.9", "--policy", "nodes", "--json",
                 str(out)]) == 0
    row = json.loads(out.read_text())
    assert (row["workload_model"], row["offered_load"], row["jobs"]) == ("lublin", 0.9, 200)
    assert row["policy"] == "nodes"
    log = tmp_path / "t.swf"
    log.write_text("".join(f"{i} {i * 100} -1 50 4 -1 -1 4 60 -1 1 -1 -1 -1 -1 -1 -1 -1\n"
                           for i in range(1, 21)))
    assert main(["--nodes", "1", "--cores", "8", "--swf", str(log), "--policy",
                 "static", "--swf-offered-load", "1.0", "--json", str(out)]) == 0
    row = json.loads(out.read_text())
    # 20 jobs of 4 cores x 50 s arriving over 1,900 s on 8 cores: 4000 / 15200.
    assert row["natural_offered_load"] == pytest.approx(4000 / 15200)
    assert row["offered_load"] == 1.0 and row["jobs"] == 20
