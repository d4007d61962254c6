"""The replay's pure half (malleable_sim/replay.py; benchmarks/cluster/slurm_replay.py runs the
cluster): the slice, its compression (limits rounded up to Slurm's whole minutes), the
start-time error, and reading slurmctld's log."""
from __future__ import annotations

import math
from datetime import datetime

import pytest

from malleable_sim import Amdahl, SimJob
from malleable_sim import replay
from malleable_sim.swf import SWFRecord, SWFHeader, SWFLog



def rec(job, submit, run, procs, req, status=1):
    return SWFRecord(job, submit, -1, run, procs, -1, -1, procs, req, -1, status, 1, 1, -1, 1, 1,
                     -1, -1)


def sim_job(job_id, submit, cores, run, limit):
    return SimJob(job_id, submit, cores, run, Amdahl(), time_limit_s=limit)


def test_slice_takes_consecutive_lines_and_counts_drops():
    log = SWFLog(SWFHeader(), tuple(
        [rec(1, 100, 10, 1, 60), rec(2, 150, 20, 2, 60), rec(3, 160, -1, 2, 60),
         rec(4, 170, 30, 500, 60), rec(5, 180, 40, 4, 60)]))
    jobs, drops = replay.slice_jobs(log, 1, 4, nodes=2, cores=8)
    assert [j.job_id for j in jobs] == [2, 5]
    assert drops["dropped"]["no_runtime"] == 1 and drops["dropped"]["wider_than_cluster"] == 1
    with pytest.raises(ValueError):
        replay.slice_jobs(log, 3, 3, nodes=2, cores=8)


def test_limit_minutes_round_up_with_the_margin_and_never_below_one():
    assert replay.limit_minutes(60 * 100, 100, margin_s=0) == 1       # exactly 60 s
    assert replay.limit_minutes(60 * 100, 100, margin_s=2) == 2       # 62 s
    assert replay.limit_minutes(5, 100) == 1
    assert replay.limit_minutes(14400, 160) == 2                      # 90 s + 2 s


def test_compress_divides_every_time_by_the_factor_and_keeps_order():
    jobs = [sim_job(7, 1000.0, 4, 300.0, 3600.0), sim_job(3, 1000.0, 1, 50.0, 600.0),
            sim_job(9, 2000.0, 30, 7200.0, 7200.0)]
    out = replay.compress(jobs, 100.0)
    assert [j.trace_job for j in out] == [3, 7, 9]          # submit, then job number
    assert [j.index for j in out] == [1, 2, 3]
    assert [j.submit_s for j in out] == [0.0, 0.0, 10.0]
    assert [j.sleep_s for j in out] == [0.5, 3.0, 72.0]
    assert [j.limit_min for j in out] == [1, 1, 2]           # 6+2 s, 36+2 s, 72+2 s
    # The limit never falls below the sleep plus the margin: no job outlives its limit.
    assert all(j.limit_s >= j.sleep_s + replay.LAUNCH_MARGIN_S for j in out)
    with pytest.raises(ValueError):
        replay.compress(jobs, 0)


def test_rounding_report_says_how_much_limits_were_raised():
    jobs = replay.compress([sim_job(1, 0.0, 1, 600.0, 6000.0),      # 60 s -> 2 min (margin)
                            sim_job(2, 0.0, 1, 10.0, 600.0)], 100.0)   # 6 s -> 1 min
    r = replay.rounding_report(jobs, 100.0)
    assert r["limit_minutes_count"] == {"1": 1, "2": 1}
    assert r["at_one_minute"] == 1
    assert r["limit_raised_median_x"] == pytest.approx((2.0 + 10.0) / 2)
    assert r["sleeps_under_1s"] == 1


def test_sim_jobs_carry_the_rounded_limit_and_take_measured_inputs():
    jobs = replay.compress([sim_job(1, 0.0, 2, 600.0, 900.0), sim_job(2, 50.0, 1, 100.0, 100.0)],
                           10.0)
    sj = replay.sim_jobs(jobs)
    assert [(j.job_id, j.submit_s, j.cores, j.runtime_s, j.time_limit_s) for j in sj] == \
        [(1, 0.0, 2, 60.0, 120.0), (2, 5.0, 1, 10.0, 60.0)]
    sj = replay.sim_jobs(jobs, submit={2: 5.25}, runtime={1: 60.5})
    assert (sj[0].runtime_s, sj[1].submit_s) == (60.5, 5.25)


def test_start_errors_relative_to_the_real_wait_with_a_floor():
    T = replay.Times
    real = {1: T(0.0, 0.2, 10.0), 2: T(0.0, 20.0, 30.0), 3: T(5.0, 45.0, 100.0)}
    sim = {1: T(0.0, 0.0, 10.0), 2: T(0.0, 21.0, 31.0), 3: T(5.0, 25.0, 80.0)}
    e = replay.start_errors(sim, real, floor_s=1.0)
    # job 1 waited 0.2 s: counted as 1 s, error 0.2; job 2: 1/20; job 3: 20/40.
    assert e["per_job_relative"] == {"1": pytest.approx(0.2), "2": pytest.approx(0.05),
                                     "3": pytest.approx(0.5)}
    assert e["relative"]["median"] == pytest.approx(0.2)
    assert e["relative"]["p90"] == pytest.approx(0.2 + 0.8 * 0.3)
    assert e["relative_waited"]["n"] == 2                      # jobs 2 and 3
    assert e["span_s"] == 100.0
    assert e["span"]["max"] == pytest.approx(0.2)
    assert e["abs_s"]["median"] == pytest.approx(1.0)
    assert e["within_10pct"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        replay.start_errors(sim, real, floor_s=0.0)
    with pytest.raises(ValueError):
        replay.start_errors({9: T(0, 0, 1)}, real, floor_s=1.0)


def test_schedule_metrics():
    T = replay.Times
    m = replay.schedule_metrics({1: T(0.0, 2.0, 10.0), 2: T(4.0, 4.0, 20.0)})
    assert m["mean_wait_s"] == 1.0 and m["mean_response_s"] == 13.0 and m["makespan_s"] == 20.0


CTLD = """\
[2026-11-26T06:32:55.802] _slurm_rpc_submit_batch_job: JobId=1 InitPrio=4294901759 usec=613
[2026-11-26T06:32:56.334] sched/backfill: _start_job: Started JobId=1 in debug on rp1
[2026-11-26T06:32:56.434] _job_complete: JobId=1 WEXITSTATUS 0
[2026-11-26T06:32:56.434] _job_complete: JobId=1 done
[2026-11-26T06:33:09.344] _slurm_rpc_submit_batch_job: JobId=11 InitPrio=4294901749 usec=513
[2026-11-26T06:33:09.359] sched: Allocate JobId=11 NodeList=rp[1-3] #CPUs=60 Partition=debug
[2026-11-26T06:33:12.000] _job_complete: JobId=11 done
"""


def test_parse_ctld_log_reads_both_schedulers_to_the_millisecond():
    jobs = replay.parse_ctld_log(CTLD)
    t = lambda s: datetime.fromisoformat(s).timestamp()  # noqa: E731
    assert jobs[1].how == "backfill" and jobs[1].nodes == "rp1"
    assert jobs[1].submit == t("2026-11-26T06:32:55.802")
    assert jobs[1].start - jobs[1].submit == pytest.approx(0.532)
    assert jobs[1].end == t("2026-11-26T06:32:56.434")
    assert jobs[11].how == "main" and jobs[11].nodes == "rp[1-3]"
    assert jobs[11].end - jobs[11].start == pytest.approx(2.641)


def test_parse_jobcomp():
    line = ("JobId=2 UserId=root(0) GroupId=root(0) Name=wrap JobState=COMPLETED "
            "Partition=debug TimeLimit=1 StartTime=2026-11-26T05:40:44 "
            "EndTime=2026-11-26T05:40:45 NodeList=rp2 NodeCnt=1 ProcCnt=1 ReservationName= \n")
    out = replay.parse_jobcomp(line)
    assert out[2]["StartTime"] == "2026-11-26T05:40:44" and out[2]["JobState"] == "COMPLETED"
    assert out[2]["ReservationName"] == ""


def test_scheduler_parameters_match_the_simulators():
    assert replay.scheduler_parameters(1) == \
        "bf_interval=1,bf_max_job_test=500,bf_resolution=1"
    assert math.isclose(replay.BF_MAX_JOB_TEST, 500)


def test_fit_cadence_numbers_the_passes_that_started_nothing():
    # 10.334 and 10.344 are one pass (its starts take a few ms); 11.336 -> 14.338 holds two
    # passes that started nothing: passes 0, 1, 4 at a period a little over 1 s.
    c = replay.fit_cadence([10.334, 10.344, 11.336, 14.338], 1.0)
    assert c.passes_seen == 3
    assert c.period_s == pytest.approx(1.001, abs=5e-4)
    assert c.phase_s == pytest.approx(10.333, abs=2e-3)
    assert c.max_residual_s < 0.005
    # A drift that adds up over many passes (1.003 s each) is still numbered pass by pass.
    drifting = [5.0 + 1.003 * k for k in range(0, 600, 3)]
    c = replay.fit_cadence(drifting, 1.0)
    assert c.period_s == pytest.approx(1.003, abs=1e-4) and c.max_residual_s < 0.01
    with pytest.raises(ValueError, match="fewer than two"):
        replay.fit_cadence([3.0, 3.001], 1.0)
