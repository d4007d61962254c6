"""Where a job that fits a node goes when no node holds it now (``Placement``): it waits for one
node (ONE_NODE, the default) or its tasks are spread over several, as select/cons_tres does
with ``sbatch -n P`` (SLURM_TASKS), in the main scheduler and in both backfills' planning."""
from __future__ import annotations

import json

import pytest

from malleable_sim.cli import main
from malleable_sim import Amdahl, Backfill, Placement, SimJob, SimPolicy, simulate

LINEAR = Amdahl(serial=0.0, comm=0.0)


def job(i, submit, cores, run, limit=None):
    return SimJob(i, submit, cores, run, LINEAR, time_limit_s=limit)


def run(jobs, placement, backfill=Backfill.CONSERVATIVE, nodes=2, cores=4):
    # The main scheduler at every arrival (batch_sched_delay 0): where jobs go, not when.
    res = simulate(jobs, nodes=nodes, cores=cores, policy=SimPolicy.STATIC, backfill=backfill,
                   backfill_interval_s=1.0, placement=placement, batch_sched_delay_s=0.0)
    return {j.job_id: j for j in res.per_job}


# Two nodes of 4: A (3 cores, 100 s) and B (3 cores, 100 s) leave one core free on each.
BUSY = [job(1, 0.0, 3, 100.0), job(2, 0.0, 3, 100.0)]


def test_slurm_tasks_is_the_default_and_one_node_waits_for_one_node():
    jobs = BUSY + [job(3, 1.0, 2, 10.0)]
    default = {j.job_id: j for j in simulate(jobs, nodes=2, cores=4, policy=SimPolicy.STATIC,
                                             batch_sched_delay_s=0.0).per_job}
    one = run(jobs, Placement.ONE_NODE)
    assert one[3].start_s == pytest.approx(100.0) and one[3].nodes == 1
    tasks = run(jobs, Placement.SLURM_TASKS)
    assert (default[3].start_s, default[3].nodes) == (tasks[3].start_s, tasks[3].nodes) \
        == (1.0, 2)


@pytest.mark.parametrize("backfill", list(Backfill))
def test_slurm_tasks_spreads_a_job_that_no_node_holds(backfill):
    res = run(BUSY + [job(3, 1.0, 2, 10.0)], Placement.SLURM_TASKS, backfill)
    assert res[3].start_s == pytest.approx(1.0)       # at submission, by the main scheduler
    assert res[3].nodes == 2                          # one core on each node
    assert res[3].end_s == pytest.approx(11.0)        # the multi-node model: same pace


@pytest.mark.parametrize("placement", list(Placement))
def test_a_job_goes_on_one_node_when_one_holds_it_best_fit(placement):
    # A (2 cores) leaves 2 free on its node, the other node is idle: B (2 cores) fits both;
    # best fit puts it beside A, so C (4 cores) then still starts on the idle node.
    res = run([job(1, 0.0, 2, 100.0), job(2, 1.0, 2, 100.0), job(3, 2.0, 4, 10.0)], placement)
    assert res[2].nodes == 1 and res[2].start_s == pytest.approx(1.0)
    assert res[3].nodes == 1 and res[3].start_s == pytest.approx(2.0)


@pytest.mark.parametrize("backfill", list(Backfill))
def test_backfill_spreads_a_job_only_where_it_delays_no_reservation(backfill):
    # Nodes of 4: A (3 cores) ends at 50, B (3 cores) at 100; one core free on each. C (4
    # cores) waits for A's node (reserved at 50). D (2 cores) could start now spread over the
    # two free cores: with a limit of 40 s it ends before C's start and is backfilled (at the
    # pass after its arrival); with 200 s it would hold one of C's cores, so it waits.
    base = [job(1, 0.0, 3, 50.0, 50.0), job(2, 0.0, 3, 100.0, 100.0), job(3, 1.0, 4, 10.0, 10.0)]
    short = run(base + [job(4, 1.5, 2, 30.0, 40.0)], Placement.SLURM_TASKS, backfill)
    assert short[3].start_s == pytest.approx(50.0)
    assert 1.5 <= short[4].start_s <= 3.0 and short[4].nodes == 2
    long_ = run(base + [job(4, 1.5, 2, 30.0, 200.0)], Placement.SLURM_TASKS, backfill)
    assert long_[3].start_s == pytest.approx(50.0)    # never delayed by D
    assert long_[4].start_s >= 50.0
    one = run(base + [job(4, 1.5, 2, 30.0, 40.0)], Placement.ONE_NODE, backfill)
    assert one[4].start_s >= 50.0 and one[4].nodes == 1    # no single node holds it sooner


def test_conservative_backfill_plans_a_spread_job_around_whole_node_reservations():
    # Nodes of 4: A (3 cores) until 100 and B (3 cores) until 30; W (8 cores: both nodes)
    # waits from 1, reserved at 100. E (4 cores, 40 s) is reserved on B's node at 30. F (2
    # cores) after them: spread over the two free cores it fits now if it ends by 30 (limit
    # 25 s); with 60 s it would hold a core of E's node (a reservation holds its nodes whole):
    # it waits. One node: no node has 2 free before 30, so it waits in any case.
    def jobs(limit):
        return [job(1, 0.0, 3, 100.0, 100.0), job(2, 0.0, 3, 30.0, 30.0),
                job(3, 1.0, 8, 10.0, 10.0), job(4, 1.0, 4, 40.0, 40.0),
                job(5, 1.0, 2, limit - 5.0, limit)]
    tasks, one = run(jobs(25.0), Placement.SLURM_TASKS), run(jobs(25.0), Placement.ONE_NODE)
    assert tasks[3].start_s == pytest.approx(100.0) == one[3].start_s
    assert tasks[4].start_s == pytest.approx(30.0) == one[4].start_s
    assert tasks[5].nodes == 2 and tasks[5].start_s == pytest.approx(2.0)
    assert one[5].nodes == 1 and one[5].start_s >= 30.0
    late = run(jobs(60.0), Placement.SLURM_TASKS)
    assert late[5].start_s >= 30.0 and late[4].start_s == pytest.approx(30.0)


def test_the_placements_agree_when_every_job_is_wider_than_a_node_or_fits_freely():
    jobs = [job(1, 0.0, 6, 50.0), job(2, 5.0, 5, 20.0), job(3, 6.0, 8, 10.0)]
    one, tasks = run(jobs, Placement.ONE_NODE), run(jobs, Placement.SLURM_TASKS)
    assert {i: (j.start_s, j.end_s) for i, j in one.items()} == \
        {i: (j.start_s, j.end_s) for i, j in tasks.items()}


def test_the_cli_passes_placement_to_the_simulation(tmp_path):
    """`malleable-sim --placement`: the two rules give different schedules of one
    generated workload (4 nodes x 4 cores, 40 jobs, seed 1), and a wrong name is refused."""
    made = {}
    for placement in ("one-node", "slurm-tasks"):
        out = tmp_path / f"{placement}.json"
        assert main(["--nodes", "4", "--cores", "4", "--jobs", "40", "--policy",
                     "static", "--placement", placement, "--json", str(out)]) == 0
        made[placement] = json.loads(out.read_text())
    # Different schedules: some job starts elsewhere or later (the makespans may still agree).
    assert made["one-node"]["mean_response_s"] != made["slurm-tasks"]["mean_response_s"]
    with pytest.raises(SystemExit) as exc:
        main(["--placement", "anywhere"])
    assert exc.value.code == 2
