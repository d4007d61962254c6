"""The metrics the field reports, per policy: response, wait (mean and 95th percentile), bounded
slowdown against the runtime at the requested size, core-seconds, utilisation; and the closed
batch beside the open stream."""
from __future__ import annotations

import json

import pytest

from malleable_policy.request import MalleableSpec
from malleable_sim import (Amdahl, SimJob, SimPolicy, ask_share, closed_batch, generate,
                                    simulate)
from malleable_sim.metrics import TAU_S, bounded_slowdown, percentile

LINEAR = Amdahl(serial=0.0, comm=0.0)
METRICS = {"jobs", "jobs_dropped", "core_seconds", "makespan_s", "lower_bound_makespan_s",
           "mean_response_s", "p95_response_s", "mean_wait_s", "p95_wait_s",
           "mean_bounded_slowdown", "utilisation"}


def test_percentiles_are_linear_between_ranks():
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 95) == pytest.approx(4.8)
    assert percentile([7.0], 95) == 7.0 and percentile([1.0, 2.0], 50) == 1.5
    with pytest.raises(ValueError):
        percentile([], 95)


def test_bounded_slowdown_counts_short_jobs_as_tau_and_never_goes_below_one():
    assert TAU_S == 10.0
    assert bounded_slowdown(5.0, 1.0) == 1.0          # 5 s over tau, not 5x
    assert bounded_slowdown(40.0, 2.0) == 4.0
    assert bounded_slowdown(100.0, 20.0) == 5.0
    assert bounded_slowdown(50.0, 100.0) == 1.0       # faster than at its size: no credit


def test_the_metrics_of_a_small_schedule():
    """One node of 4 cores: a 4-core job for 100 s at 0, a 2-core job for 50 s at 10 that
    waits for it (ends at 150)."""
    r = simulate([SimJob(1, 0.0, 4, 100.0, LINEAR), SimJob(2, 10.0, 2, 50.0, LINEAR)],
                 nodes=1, cores=4, policy=SimPolicy.STATIC, backfill_interval_s=1.0)
    assert (r.jobs, r.makespan_s, r.core_seconds) == (2, 150.0, 500.0)
    assert (r.mean_response_s, r.p95_response_s) == (120.0, pytest.approx(138.0))
    assert (r.mean_wait_s, r.p95_wait_s) == (45.0, pytest.approx(85.5))
    assert r.mean_bounded_slowdown == pytest.approx((1.0 + 140 / 50) / 2)
    assert r.utilisation == pytest.approx(500 / (4 * 150))
    assert r.mean_completion_s == r.mean_response_s    # the earlier name still reads


def test_bounded_slowdown_is_against_the_runtime_at_the_requested_size():
    """A malleable job asking a quarter of its 4 cores takes 400 s at its ask; alone under
    lend-idle it grows back to 4 and takes 100 s: no slowdown, as its size would give."""
    job = SimJob(1, 0.0, 4, 100.0, LINEAR, MalleableSpec(min_cpus=1, max_cpus=4))
    (asked,) = ask_share([job], 0.25, 4)
    assert (asked.cores, asked.runtime_s, asked.reference_s) == (1, 400.0, 100.0)
    grown = simulate([asked], nodes=1, cores=4, policy=SimPolicy.LEND_IDLE)
    assert grown.per_job[0].response_s == pytest.approx(100.0)
    assert grown.mean_bounded_slowdown == pytest.approx(1.0)
    narrow = simulate([asked], nodes=1, cores=4, policy=SimPolicy.STATIC)
    assert narrow.mean_bounded_slowdown == pytest.approx(4.0)


def test_a_closed_batch_submits_every_job_at_once_in_the_same_order():
    jobs = generate(50, 2, 8, 0.5, 3)
    batch = closed_batch(jobs)
    assert [j.job_id for j in batch] == [j.job_id for j in jobs]
    assert {j.submit_s for j in batch} == {0.0}
    r = simulate(batch, nodes=2, cores=8, policy=SimPolicy.THROUGHPUT)
    assert r.makespan_s == max(j.end_s for j in r.per_job)
    assert r.mean_wait_s > simulate(jobs, nodes=2, cores=8, policy=SimPolicy.THROUGHPUT).mean_wait_s


def test_every_metric_is_in_the_json_per_policy_open_and_closed(tmp_path):
    from malleable_sim.cli import main
    out = tmp_path / "out.json"
    for extra in ([], ["--closed-batch"]):
        assert main(["--nodes", "2", "--cores", "8", "--jobs", "60", "--policy",
                     "all", "--json", str(out), *extra]) == 0
        rows = json.loads(out.read_text())
        for row in rows:
            assert METRICS <= set(row), METRICS - set(row)
            assert row["closed_batch"] == bool(extra)
            assert row["p95_wait_s"] >= 0 and row["mean_bounded_slowdown"] >= 1.0
            assert row["core_seconds"] == pytest.approx(
                row["utilisation"] * 16 * row["makespan_s"])
