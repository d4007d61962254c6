"""The simulator (pure): speedup curves, the scheduler stand-in, the agent's decide driving the
cores, the fluid lower bound (SWF logs: test_simulator_swf.py)."""
from __future__ import annotations

import pytest

from malleable_policy.request import MalleableSpec
from malleable_sim import (Amdahl, Backfill, Measured, QueueOrder, SimJob, SimPolicy,
                                    Simulation, ask_share, fluid_lower_bound, generate, simulate)
from malleable_sim.workload import time_cost_frontier

LINEAR = Amdahl(serial=0.0, comm=0.0)


def test_amdahl_rates_and_best_rate():
    a = Amdahl(serial=0.1, comm=0.01)
    assert a.rate(1) == pytest.approx(1.0)
    rates = [a.rate(n) for n in range(1, 65)]
    peak = max(rates)
    # The frontier's fastest point is the best rate, its cheapest the least cost per unit.
    assert 1 / time_cost_frontier(a, 1, 64)[0][0] == pytest.approx(peak)
    assert rates.index(peak) + 1 == 9       # n* = sqrt(0.9 / 0.01) = 9.49: 9 or 10
    assert 1 / time_cost_frontier(a, 1, 4)[0][0] == pytest.approx(a.rate(4))
    assert LINEAR.rate(8) == pytest.approx(8.0)
    assert time_cost_frontier(a, 1, 64)[-1][1] == pytest.approx(1.0)


def test_measured_curve_is_normalised_and_flat_beyond_its_points():
    m = Measured.from_steps_per_s({1: 50.0, 2: 90.0, 4: 120.0})
    assert m.rate(1) == pytest.approx(1.0) and m.rate(2) == pytest.approx(1.8)
    assert m.rate(3) == pytest.approx(2.1) and m.rate(8) == pytest.approx(2.4)
    assert 1 / time_cost_frontier(m, 1, 8)[0][0] == pytest.approx(2.4)
    assert time_cost_frontier(m, 1, 4)[-1][1] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        Measured.from_steps_per_s({2: 0.0})


def one_node(jobs, policy, cores=4):
    # A backfill pass every second: the small examples' jobs arrive on whole seconds.
    return simulate(jobs, nodes=1, cores=cores, policy=policy, backfill_interval_s=1.0)


def test_a_malleable_job_alone_grows_into_the_idle_cores_only_when_its_threads_follow():
    job = SimJob(1, 0.0, 1, 100.0, LINEAR, MalleableSpec(min_cpus=1, max_cpus=4))
    ends = {p: one_node([job], p).per_job[0].end_s for p in SimPolicy}
    assert ends[SimPolicy.STATIC] == pytest.approx(100.0)
    assert ends[SimPolicy.LEND_IDLE] == pytest.approx(25.0)    # 4 cores, linear: 4x
    assert ends[SimPolicy.THROUGHPUT] == pytest.approx(25.0)
    # The cgroup grew, the threads did not: no faster than static.
    assert ends[SimPolicy.CGROUP_ONLY] == pytest.approx(100.0)
    assert one_node([job], SimPolicy.CGROUP_ONLY).resizes == 0   # the start is no resize
    u = one_node([job], SimPolicy.LEND_IDLE).utilisation
    assert u == pytest.approx(1.0)


def test_a_new_job_gets_its_allocation_back_from_a_borrower_at_once():
    borrower = SimJob(1, 0.0, 2, 100.0, LINEAR, MalleableSpec(min_cpus=1, max_cpus=4))
    rigid = SimJob(2, 10.0, 2, 30.0, LINEAR)
    r = one_node([borrower, rigid], SimPolicy.LEND_IDLE)
    by_id = {j.job_id: j for j in r.per_job}
    assert by_id[2].start_s == pytest.approx(10.0) and by_id[2].end_s == pytest.approx(40.0)
    # 200 units of work: 40 done at 4 cores in 10 s, then 2 cores until the rigid job ends
    # (60 more), then 4 again: 100 left at 4 = 25 s.
    assert by_id[1].end_s == pytest.approx(65.0)
    assert r.resizes == 2
    static = {j.job_id: j for j in one_node([borrower, rigid], SimPolicy.STATIC).per_job}
    assert static[1].end_s == pytest.approx(100.0) and static[2].end_s == pytest.approx(40.0)


def test_jobs_wait_first_come_first_served_and_small_ones_fill_gaps():
    big = SimJob(1, 0.0, 3, 50.0, LINEAR)
    waits = SimJob(2, 1.0, 2, 10.0, LINEAR)      # does not fit beside the first
    fills = SimJob(3, 2.0, 1, 10.0, LINEAR)      # fits: starts before job 2
    r = {j.job_id: j for j in one_node([big, waits, fills], SimPolicy.STATIC).per_job}
    assert r[3].start_s == pytest.approx(2.0)
    assert r[2].start_s == pytest.approx(50.0)
    # Between backfill passes the main scheduler keeps to queue order: with Slurm's 30 s
    # bf_interval the small job waits behind the blocked one until the pass at 30 s (on
    # slurmctld's cadence, not 30 s after the queue formed).
    late = {j.job_id: j for j in simulate([big, waits, fills], nodes=1, cores=4,
                                          policy=SimPolicy.STATIC).per_job}
    assert late[3].start_s == pytest.approx(30.0) and late[2].start_s == pytest.approx(50.0)


def test_a_wide_job_is_not_starved_by_narrow_ones_behind_it():
    """EASY backfill: the first job that does not fit gets a reservation; a later job starts
    before it only if it is expected to end by then or uses cores the reservation leaves."""
    first = SimJob(1, 0.0, 2, 100.0, LINEAR)
    wide = SimJob(2, 1.0, 4, 10.0, LINEAR)        # needs the whole node: reserved at 100
    long_ = SimJob(3, 2.0, 2, 200.0, LINEAR)      # fits now but would end at 202: waits
    short = SimJob(4, 3.0, 2, 50.0, LINEAR)       # ends at 53, before the reservation
    def easy(jobs, cores=4):
        return {j.job_id: j for j in simulate(jobs, nodes=1, cores=cores, policy=SimPolicy.STATIC,
                                              backfill=Backfill.EASY,
                                              backfill_interval_s=1.0).per_job}

    r = easy([first, wide, long_, short])
    assert r[4].start_s == pytest.approx(3.0)
    assert r[2].start_s == pytest.approx(100.0) and r[2].end_s == pytest.approx(110.0)
    assert r[3].start_s == pytest.approx(110.0)
    # On a node with room beside the reservation, the long job may use the spare cores.
    # 6 cores: the wide job is reserved at 100 with 2 cores to spare, which the long one takes.
    r6 = easy([SimJob(1, 0.0, 4, 100.0, LINEAR), wide, long_], cores=6)
    assert r6[3].start_s == pytest.approx(2.0) and r6[2].start_s == pytest.approx(100.0)


def test_start_up_time_does_not_shrink_with_cores():
    job = SimJob(1, 0.0, 1, 100.0, LINEAR, MalleableSpec(min_cpus=1, max_cpus=4), startup_s=10.0)
    assert one_node([job], SimPolicy.STATIC).per_job[0].end_s == pytest.approx(110.0)
    assert one_node([job], SimPolicy.LEND_IDLE).per_job[0].end_s == pytest.approx(35.0)
    assert fluid_lower_bound([job], 1, 4) == pytest.approx(35.0)


def test_the_time_cost_frontier_is_the_lower_hull_from_fastest_to_cheapest():
    # Amdahl, half serial: 1..4 cores take 1, 0.75, 0.667, 0.625 s per unit and cost 1, 1.5,
    # 2, 2.5 core-s per unit; each point is on the hull (the curve is convex).
    frontier = time_cost_frontier(Amdahl(serial=0.5), 1, 4)
    assert [x for point in frontier for x in point] == pytest.approx(
        [0.625, 2.5, 2 / 3, 2.0, 0.75, 1.5, 1.0, 1.0])
    # Past its peak (sqrt(0.9 / 0.1) = 3 cores) a width is slower and costlier: left out.
    peaked = time_cost_frontier(Amdahl(serial=0.1, comm=0.1), 1, 8)
    assert len(peaked) == 3 and peaked[0][1] == pytest.approx(3 / Amdahl(0.1, 0.1).rate(3))
    # A point above the chord of its neighbours is never the cheapest way to take that time.
    bumpy = Measured.from_steps_per_s({1: 1.0, 2: 1.1, 3: 2.7})
    assert [round(t, 3) for t, _ in time_cost_frontier(bumpy, 1, 3)] == [0.37, 1.0]


def test_the_fluid_bound_makes_a_job_that_must_end_sooner_run_wider_and_cost_more():
    """Two half-serial jobs on 4 cores. Each alone could end in 62.5 s (4 cores), and each
    could do its work in 100 core-s (1 core); no schedule does both. The bound asks each job to
    end by E and to fit the cores: 2 cores each, 75 s, which lend-idle reaches."""
    half = Amdahl(serial=0.5)
    jobs = [SimJob(i, 0.0, 1, 100.0, half, MalleableSpec(min_cpus=1, max_cpus=4)) for i in (1, 2)]
    assert fluid_lower_bound(jobs, 1, 4) == pytest.approx(75.0, rel=1e-4)
    assert fluid_lower_bound(jobs, 1, 4) <= 75.0
    assert one_node(jobs, SimPolicy.LEND_IDLE).makespan_s == pytest.approx(75.0)
    # A rigid job runs at its own size only, even where fewer cores would be faster.
    peaked = Amdahl(serial=0.1, comm=0.1)
    rigid = SimJob(1, 0.0, 8, 100.0, peaked)
    assert fluid_lower_bound([rigid], 1, 8) == pytest.approx(100.0, rel=1e-4)


def test_the_queue_order_is_slurms_priority_in_every_regime():
    """Node of 4 cores, full until 10 s; then a 2-core job (10 s), a 4-core job (30 s) and a
    1-core job (60 s) wait, submitted in that order."""
    jobs = [SimJob(1, 0.0, 4, 10.0, LINEAR), SimJob(2, 1.0, 2, 10.0, LINEAR),
            SimJob(3, 2.0, 4, 30.0, LINEAR), SimJob(4, 3.0, 1, 60.0, LINEAR)]

    def starts(order):
        r = simulate(jobs, nodes=1, cores=4, policy=SimPolicy.STATIC, backfill_interval_s=1.0,
                     queue_order=order)
        assert r.queue_order == order.value
        return {j.job_id: j.start_s for j in r.per_job}, r.makespan_s

    # First come: 2, then 3 (whole node); the 1-core job would delay 3's reservation.
    assert starts(QueueOrder.FCFS) == ({1: 0.0, 2: 10.0, 3: 20.0, 4: 50.0}, 110.0)
    # Most cores first: 3 at once, then 2 and 4 side by side.
    assert starts(QueueOrder.WIDEST_FIRST) == ({1: 0.0, 2: 40.0, 3: 10.0, 4: 40.0}, 100.0)
    # Longest first: 4, the 2-core job backfills beside it (ends before 3's reservation).
    assert starts(QueueOrder.LONGEST_FIRST) == ({1: 0.0, 2: 10.0, 3: 70.0, 4: 10.0}, 100.0)


def test_a_malleable_job_may_ask_for_less_and_keeps_its_work_and_maximum():
    curve = Amdahl(serial=0.1)
    mall = SimJob(1, 0.0, 8, 100.0, curve, MalleableSpec(min_cpus=1, max_cpus=32))
    rigid = SimJob(2, 0.0, 8, 100.0, curve)
    small_max = SimJob(3, 0.0, 8, 100.0, curve, MalleableSpec(min_cpus=3, max_cpus=8))
    a, b, c = ask_share([mall, rigid, small_max], 0.25, 64)
    assert (a.cores, a.max_cores(64), a.min_cores(64)) == (2, 32, 1)
    assert a.work == pytest.approx(mall.work) and a.runtime_s > mall.runtime_s
    assert b == rigid
    assert (c.cores, c.max_cores(64), c.min_cores(64)) == (3, 8, 3)   # never below its min
    assert ask_share([mall], 1.0, 64) == [mall]
    with pytest.raises(ValueError):
        ask_share([mall], 0.0, 64)
    # Asking for a quarter, alone on a node, it still grows to its maximum.
    alone = one_node([a], SimPolicy.LEND_IDLE, cores=32).per_job[0]
    assert alone.end_s == pytest.approx(mall.work / curve.rate(32))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_policy_stays_above_the_fluid_lower_bound_and_is_deterministic(seed):
    jobs = generate(300, 4, 16, 0.5, seed)
    lb = fluid_lower_bound(jobs, 4, 16)
    for policy in SimPolicy:
        a = simulate(jobs, nodes=4, cores=16, policy=policy)
        b = simulate(jobs, nodes=4, cores=16, policy=policy)
        if policy is SimPolicy.NODES:     # jobs of a whole node may run on more nodes
            assert a.makespan_s >= a.lower_bound_makespan_s * (1 - 1e-9)
            assert a.lower_bound_makespan_s <= lb * (1 + 1e-9)
        else:
            assert a.makespan_s >= lb * (1 - 1e-9), (policy, a.makespan_s, lb)
            assert a.lower_bound_makespan_s == pytest.approx(lb)
        assert a.summary() | {"wall_s": 0} == b.summary() | {"wall_s": 0}
        assert a.jobs == 300 and 0 < a.utilisation <= 1.0 + 1e-9
    static = simulate(jobs, nodes=4, cores=16, policy=SimPolicy.STATIC)
    cg = simulate(jobs, nodes=4, cores=16, policy=SimPolicy.CGROUP_ONLY)
    assert cg.makespan_s == pytest.approx(static.makespan_s)


def test_no_malleable_job_means_every_policy_is_static():
    jobs = generate(200, 2, 8, 0.0, 5)
    base = simulate(jobs, nodes=2, cores=8, policy=SimPolicy.STATIC).summary()
    for policy in (SimPolicy.LEND_IDLE, SimPolicy.THROUGHPUT):
        r = simulate(jobs, nodes=2, cores=8, policy=policy).summary()
        assert r["makespan_s"] == pytest.approx(base["makespan_s"])
        assert r["resizes"] == 0


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="asks for 9 cores"):
        Simulation([SimJob(1, 0.0, 9, 1.0, LINEAR)], nodes=1, cores=8, policy=SimPolicy.STATIC)
    with pytest.raises(ValueError):
        generate(10, 1, 8, 1.5, 1)
    with pytest.raises(ValueError):
        generate(0, 1, 8, 0.5, 1)


def test_the_command_line_writes_the_summary(tmp_path, capsys):
    from malleable_sim.cli import main
    out = tmp_path / "out.json"
    assert main(["--nodes", "3", "--cores", "8", "--jobs", "100", "--policy", "all",
                 "--seed", "4", "--json", str(out)]) == 0
    import json
    rows = json.loads(out.read_text())
    assert [r["policy"] for r in rows] == ["static", "static-ask", "moldable", "cgroup-only", "lend-idle",
                                           "throughput", "nodes"]
    for r in rows:
        assert {"makespan_s", "mean_response_s", "utilisation", "lower_bound_makespan_s",
                "wall_s"} <= set(r)
        assert r["makespan_s"] >= r["lower_bound_makespan_s"] > 0 and r["jobs"] == 100
    assert main(["--nodes", "3", "--cores", "8", "--jobs", "100", "--policy", "all",
                 "--seed", "4", "--malleable-ask", "0.5", "--json", str(out)]) == 0
    asked = {r["policy"]: r for r in json.loads(out.read_text())}
    base = {r["policy"]: r for r in rows}
    # Static and cgroup-only run every job at its size whatever the ask; the others do not.
    for p in ("static", "cgroup-only"):
        assert asked[p]["makespan_s"] == pytest.approx(base[p]["makespan_s"])
    assert base["static-ask"]["makespan_s"] == pytest.approx(base["static"]["makespan_s"])
    assert asked["static-ask"]["mean_response_s"] != base["static"]["mean_response_s"]
    assert asked["lend-idle"]["malleable_ask"] == 0.5
    assert "lend-idle" in capsys.readouterr().out
    assert main(["--nodes", "3", "--cores", "8", "--jobs", "100", "--policy",
                 "static", "--seed", "4", "--queue-order", "longest-first", "--json",
                 str(out)]) == 0
    assert json.loads(out.read_text())["queue_order"] == "longest-first"
    assert base["static"]["queue_order"] == "fcfs"
