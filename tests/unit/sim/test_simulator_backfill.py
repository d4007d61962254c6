"""Slurm's backfill as Slurm does it (conservative: a reservation for every job tested, up to
bf_max_job_test, each holding its nodes whole for its time limit), with EASY kept as an
option (only the first job that does not fit is reserved)."""
from __future__ import annotations

import json

import pytest

from malleable_sim import Amdahl, Backfill, SimJob, SimPolicy, Simulation, generate, simulate

LINEAR = Amdahl(serial=0.0, comm=0.0)


def starts(jobs, backfill, *, nodes=2, cores=4, depth=500):
    r = simulate(jobs, nodes=nodes, cores=cores, policy=SimPolicy.STATIC, backfill=backfill,
                 backfill_depth=depth, backfill_interval_s=1.0)
    assert r.backfill == backfill.value
    return {j.job_id: j.start_s for j in r.per_job}


def test_conservative_backfill_protects_every_reservation_easy_only_the_first():
    """2 nodes x 4 cores: node 0 has 2 cores busy until 100 s, node 1 is full until 50 s.
    Queued: job 2 (4 cores, 100 s), job 3 (4 cores, 10 s), job 4 (2 cores, 150 s). Job 2 is
    reserved on node 1 at 50 s in both. Conservative reserves job 3 on node 0 at 100 s, so job 4
    may not take node 0's 2 free cores now (it would end at 153): it starts after job 3. EASY
    protects job 2 only: job 4 starts at once and job 3 waits until 150 s."""
    jobs = [SimJob(1, 0.0, 2, 100.0, LINEAR), SimJob(5, 0.0, 4, 50.0, LINEAR),
            SimJob(2, 1.0, 4, 100.0, LINEAR), SimJob(3, 2.0, 4, 10.0, LINEAR),
            SimJob(4, 3.0, 2, 150.0, LINEAR)]
    assert starts(jobs, Backfill.CONSERVATIVE) == {1: 0.0, 5: 0.0, 2: 50.0, 3: 100.0, 4: 110.0}
    assert starts(jobs, Backfill.EASY) == {1: 0.0, 5: 0.0, 2: 50.0, 3: 150.0, 4: 3.0}


def test_only_the_first_bf_max_job_test_jobs_are_backfilled():
    """One node of 4 cores, 3 busy until 100 s. Job 2 (the whole node) is reserved at 100 s;
    job 3 (1 core, 50 s) fits before it, but only if the pass looks that far."""
    jobs = [SimJob(1, 0.0, 3, 100.0, LINEAR), SimJob(2, 1.0, 4, 10.0, LINEAR),
            SimJob(3, 2.0, 1, 50.0, LINEAR)]
    assert starts(jobs, Backfill.CONSERVATIVE, nodes=1)[3] == 2.0
    assert starts(jobs, Backfill.CONSERVATIVE, nodes=1, depth=1)[3] == 110.0


def test_a_conservative_reservation_holds_its_nodes_whole():
    """The wide job of the EASY test (6 cores on 2 x 4, reserved at 100 s on node 0 and 2 cores
    of node 1): EASY lets a 2-core, 200 s job use node 1's 2 spare cores at once; Slurm's node
    space map holds node 1 whole from 100 s, so that job starts only when the main scheduler
    reaches it, beside the wide one. A job that ends before 100 s starts at once in both."""
    jobs = [SimJob(1, 0.0, 4, 100.0, LINEAR), SimJob(2, 1.0, 6, 10.0, LINEAR),
            SimJob(3, 2.0, 2, 200.0, LINEAR), SimJob(5, 4.0, 2, 50.0, LINEAR)]
    easy, conservative = starts(jobs, Backfill.EASY), starts(jobs, Backfill.CONSERVATIVE)
    assert easy[2] == conservative[2] == 100.0
    assert (easy[3], conservative[3]) == (2.0, 100.0)
    assert easy[5] == conservative[5] == 4.0


@pytest.mark.parametrize("nodes, wide", [(1, 4), (2, 8)])
def test_a_job_that_cannot_start_within_bf_window_gets_no_reservation(nodes, wide):
    """Slurm's bf_window (a day by default): job 1 holds 3 cores for 100,000 s, so jobs 2 and 4
    (the whole cluster) could start only after the window; they get no reservation (job 4
    meets the search job 2 already made), and job 3 (1 core, 200,000 s) starts at once. With
    no window, job 2's reservation holds the node from 100,000 s and job 3 waits for it."""
    jobs = [SimJob(1, 0.0, 3, 100_000.0, LINEAR), SimJob(2, 1.0, wide, 10.0, LINEAR),
            SimJob(4, 1.5, wide, 20.0, LINEAR), SimJob(3, 2.0, 1, 200_000.0, LINEAR)]

    def run(**kw):
        r = simulate(jobs, nodes=nodes, cores=4, policy=SimPolicy.STATIC, backfill_interval_s=1.0,
                     **kw)
        return {j.job_id: j.start_s for j in r.per_job}
    windowed, unbounded = run(), run(backfill_window_s=float("inf"))
    assert windowed[3] == 2.0
    assert unbounded[3] > unbounded[2] >= 100_000.0
    with pytest.raises(ValueError, match="backfill_window_s"):
        run(backfill_window_s=0.0)


@pytest.mark.parametrize("seed", [1, 2])
def test_every_policy_runs_under_both_and_no_job_starts_before_it_arrives(seed):
    jobs = generate(300, 4, 16, 0.5, seed)
    for backfill in Backfill:
        for policy in SimPolicy:
            r = simulate(jobs, nodes=4, cores=16, policy=policy, backfill=backfill)
            assert r.jobs == 300
            assert all(j.start_s >= j.submit_s for j in r.per_job)
            assert r.makespan_s >= r.lower_bound_makespan_s * (1 - 1e-9)


def test_the_command_line_chooses_the_backfill(tmp_path):
    from malleable_sim.cli import main
    out = tmp_path / "out.json"
    for backfill in ("conservative", "easy"):
        assert main(["--nodes", "2", "--cores", "8", "--jobs", "50", "--policy",
                     "static", "--backfill", backfill, "--json", str(out)]) == 0
        assert json.loads(out.read_text())["backfill"] == backfill


@pytest.mark.parametrize("policy", [SimPolicy.STATIC, SimPolicy.LEND_IDLE])
def test_a_job_past_its_expected_end_still_holds_its_cores(policy):
    """Job 1 (3 of 4 cores) is expected to end at 50 s (its time limit) but runs until 100 s:
    a pass after job 4 arrives at 55 s must not start the whole-node job 2 on its cores (it
    once did, on the one free core); job 2 starts when job 1 ends."""
    jobs = [SimJob(1, 0.0, 3, 100.0, LINEAR, time_limit_s=50.0),
            SimJob(2, 1.0, 4, 10.0, LINEAR), SimJob(3, 2.0, 1, 60.0, LINEAR),
            SimJob(4, 55.0, 1, 5.0, LINEAR)]
    r = simulate(jobs, nodes=1, cores=4, policy=policy, backfill_interval_s=1.0)
    assert {j.job_id: j.start_s for j in r.per_job}[2] == 100.0
    assert r.core_seconds == pytest.approx(300 + 40 + 60 + 5)


def test_backfill_passes_keep_slurmctlds_cadence_not_the_queues():
    """bf_interval is a fixed cadence (backfill's thread sleeps it between passes whatever the
    queue does): a job that cannot start by queue order at 5 s starts at the pass at 10 s (or
    at 13 s with the cadence's phase at 3 s), not 10 s after it began to wait."""
    jobs = [SimJob(1, 0.0, 3, 50.0, LINEAR), SimJob(2, 4.0, 2, 10.0, LINEAR),
            SimJob(3, 5.0, 1, 10.0, LINEAR)]
    for phase, start in ((0.0, 10.0), (3.0, 13.0)):
        r = {j.job_id: j for j in simulate(jobs, nodes=1, cores=4, policy=SimPolicy.STATIC,
                                           backfill_interval_s=10.0,
                                           backfill_phase_s=phase).per_job}
        assert r[3].start_s == pytest.approx(start) and r[2].start_s == pytest.approx(50.0)


def test_the_main_scheduler_runs_at_most_once_every_batch_sched_delay():
    """slurmctld calls schedule() for arrivals and ends only when batch_sched_delay (3 s) has
    passed since its last call; backfill may start a job sooner. Idle 1 x 4 cluster, 1-core
    jobs at 0, 1 and 1.5 s: the first starts at once, the others at 3 s (the backfill pass
    at 30 s is later); with a 2 s bf_interval, the pass at 2 s starts them."""
    jobs = [SimJob(i, t, 1, 10.0, LINEAR) for i, t in ((1, 0.0), (2, 1.0), (3, 1.5))]

    def starts(**kw):
        return [j.start_s for j in sorted(simulate(jobs, nodes=1, cores=4,
                                                   policy=SimPolicy.STATIC, **kw).per_job,
                                          key=lambda j: j.job_id)]
    assert starts() == [0.0, 3.0, 3.0]
    assert starts(backfill_interval_s=2.0) == [0.0, 2.0, 2.0]
    assert starts(batch_sched_delay_s=0.0) == [0.0, 1.0, 1.5]
    # An end is such an event too: job 2 arrives at 9 s (the main scheduler runs, it does not
    # fit), job 1 ends at 10 s; the next call is at 12 s.
    r = {j.job_id: j for j in simulate([SimJob(1, 0.0, 4, 10.0, LINEAR),
                                        SimJob(2, 9.0, 1, 5.0, LINEAR)], nodes=1, cores=4,
                                       policy=SimPolicy.STATIC,
                                       backfill_interval_s=100.0).per_job}
    assert r[2].start_s == pytest.approx(12.0)
    with pytest.raises(ValueError, match="batch_sched_delay_s"):
        simulate(jobs, nodes=1, cores=4, policy=SimPolicy.STATIC, batch_sched_delay_s=-1.0)


def test_the_next_backfill_pass_is_always_after_now():
    """At a pass's own time (computed as the cadence computes it) the next pass is the one
    after, whatever the float rounding of (now - phase) / interval: a pass at now would be
    queued again and again at the same instant. The cadence fitted from the replay's log
    (benchmarks/cluster/slurm_replay.py) hung the simulation so; from its pass 1,031 on, the rounding
    puts (now - phase) / interval just under the pass's number."""
    sim = Simulation([SimJob(1, 0.0, 1, 1.0, LINEAR)], nodes=1, cores=4,
                     policy=SimPolicy.STATIC, backfill_interval_s=1.0017917482641847,
                     backfill_phase_s=0.48179666596467996)
    for k in range(3000):
        now = sim.backfill_phase_s + k * sim.backfill_interval_s
        nxt = sim._next_backfill(now)
        assert now < nxt <= now + sim.backfill_interval_s * 1.000001
