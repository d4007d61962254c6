"""Slurm 22.05's own backfill pass (``SlurmPass``, engine._slurm_conservative): cons_tres's
_will_run_test takes the running jobs' ends in 30 s groups, and _eval_nodes places jobs."""
import pytest

from malleable_sim import Backfill, Placement, QueueOrder, SimPolicy, SlurmPass
from malleable_sim.engine import simulate
from malleable_sim.slurm_standin import eval_nodes
from malleable_sim.workload import Amdahl, SimJob


def test_eval_nodes_fills_consecutive_nodes_in_order():
    assert eval_nodes([8, 1, 25, 25], 32) == {0: 8, 1: 1, 2: 23}
    assert eval_nodes([25, 25, 25, 17], 64) == {0: 25, 1: 25, 2: 14}
    assert eval_nodes([1, 1, 0, 17], 8) == {3: 8}          # the run that holds it
    assert eval_nodes([9, 0, 25, 8], 8) == {0: 8}           # the tightest run, not node
    assert eval_nodes([3, 3, 0, 0], 8) is None


JOBS = [SimJob(1, 0.0, 20, 60.0, Amdahl(), time_limit_s=61.0),
        SimJob(2, 0.0, 3, 99.0, Amdahl(), time_limit_s=100.0),
        SimJob(3, 1.0, 22, 10.0, Amdahl(), time_limit_s=30.0),     # waits for job 1
        SimJob(4, 2.0, 2, 80.0, Amdahl(), time_limit_s=90.0)]      # ends 92 by its limit


def _starts(slurm_pass: SlurmPass | None, policy: SimPolicy = SimPolicy.STATIC
            ) -> dict[int, float]:
    res = simulate(JOBS, nodes=1, cores=25, policy=policy,
                   backfill=Backfill.CONSERVATIVE, backfill_interval_s=1.0,
                   batch_sched_delay_s=0.0, queue_order=QueueOrder.FCFS,
                   placement=Placement.SLURM_TASKS, slurm_pass=slurm_pass)
    return {r.job_id: r.start_s for r in res.per_job}


def test_grouped_ends_put_the_reservation_later_and_let_a_job_backfill():
    # The stand-in (exact ends): job 3 is reserved at 61 (job 1's end), so job 4 (to 92) may
    # not start before it.
    assert _starts(None)[4] >= 60.0
    # Slurm: the first end (61) opens a group to the 30 s barrier after it + 30 s (90 + 30),
    # so jobs 1 and 2 go together and job 3's start is job 2's end (100): job 4 fits before.
    assert _starts(SlurmPass(clock_s=0.0))[4] == 2.0


def test_it_models_rigid_jobs_under_conservative_backfill_only():
    with pytest.raises(ValueError, match="slurm_pass"):
        _starts(SlurmPass(), SimPolicy.LEND_IDLE)
    with pytest.raises(ValueError, match="slurm_pass"):
        simulate(JOBS, nodes=1, cores=25, policy=SimPolicy.STATIC, backfill=Backfill.EASY,
                 slurm_pass=SlurmPass())
