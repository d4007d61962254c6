"""Node-count malleability, simulated (the ``nodes`` regime): whole nodes taken back from
running malleable jobs so that the first queued job starts, idle nodes given to them."""
from __future__ import annotations

import pytest

from malleable_policy.request import MalleableSpec
from malleable_sim import Amdahl, SimJob, SimPolicy, simulate
from malleable_sim.config import NodeBounds
from malleable_sim.slurm_standin import BackfillProfile
from malleable_sim.lublin import Downey

LINEAR = Amdahl(serial=0.0, comm=0.0)
SPEC = MalleableSpec(min_cpus=1)


def run(jobs, policy=SimPolicy.NODES, nodes=4, cores=4, **kw):
    return simulate(jobs, nodes=nodes, cores=cores, policy=policy, backfill_interval_s=1.0,
                    **kw)


def ends(result):
    return {j.job_id: j.end_s for j in result.per_job}


def test_the_regime_asks_for_full_size_and_is_compared_with_static():
    assert SimPolicy.NODES.value == "nodes"
    assert not SimPolicy.NODES.asks_less and not SimPolicy.NODES.threads_follow
    assert SimPolicy.NODES.agent_policy is None
    assert SimPolicy.NODES.same_asks_baseline is SimPolicy.STATIC
    assert NodeBounds().fewest(4) == 2 and NodeBounds().fewest(3) == 2
    assert NodeBounds().fewest(1) == 1 and NodeBounds().most(3) == 6


def test_a_malleable_job_gives_a_node_to_the_queued_job_and_takes_it_back():
    # A holds all 4 nodes (16 cores, 100 s); B (4 cores, 10 s) arrives at 10.
    a = SimJob(1, 0.0, 16, 100.0, LINEAR, SPEC)
    b = SimJob(2, 10.0, 4, 10.0, LINEAR)
    static = run([a, b], SimPolicy.STATIC)
    assert ends(static) == {1: 100.0, 2: 110.0}
    r = run([a, b])
    # A: 10 s on 16 cores, 10 s on 12 while B runs, then its 4 nodes again.
    assert ends(r)[2] == pytest.approx(20.0)
    assert ends(r)[1] == pytest.approx(20.0 + (1600 - 160 - 120) / 16)
    assert r.resizes == 2
    # A rigid job holds its nodes: nothing moves.
    rigid = run([SimJob(1, 0.0, 16, 100.0, LINEAR), b])
    assert ends(rigid) == ends(static) and rigid.resizes == 0


def test_no_node_is_taken_unless_enough_make_the_queued_job_fit():
    # A may shrink to 2 of its 4 nodes; B needs 3 whole nodes: it waits for A's end.
    a = SimJob(1, 0.0, 16, 100.0, LINEAR, SPEC)
    b = SimJob(2, 10.0, 12, 10.0, LINEAR)
    r = run([a, b])
    assert ends(r) == {1: 100.0, 2: 110.0} and r.resizes == 0
    # With a floor of one node it can: B starts at 10 on three nodes.
    r = run([a, b], node_bounds=NodeBounds(shrink_to=0.25))
    assert ends(r)[2] == pytest.approx(20.0)


def test_idle_nodes_grow_a_job_whose_speedup_gains():
    job = SimJob(1, 0.0, 8, 100.0, LINEAR, SPEC)          # 2 nodes of 4
    assert run([job]).makespan_s == pytest.approx(50.0)   # grown to 4 nodes (grow_to 2)
    assert run([job], SimPolicy.STATIC).makespan_s == pytest.approx(100.0)
    # Downey with sigma 0 and A = 8 is flat beyond 8 cores: a node more adds nothing.
    flat = SimJob(1, 0.0, 8, 100.0, Downey(8.0, 0.0), SPEC)
    assert run([flat]).makespan_s == pytest.approx(100.0)
    # Within a node: left to the agents' regimes.
    small = SimJob(1, 0.0, 2, 100.0, LINEAR, SPEC)
    assert run([small]).makespan_s == pytest.approx(100.0)


def test_a_wide_job_is_planned_on_the_cores_of_a_job_past_its_expected_end():
    # Node 0's job was expected to end at 5 and still runs at 10 (it was shrunk, or a
    # rounding error): its cores count as freed now, not never.
    profile = BackfillProfile([0, 0], [[(5.0, 1, 4)], [(20.0, 2, 4)]], 4, 10.0)
    assert profile.earliest_wide(8, 10.0) == (20.0, {0: 4, 1: 4})


def test_the_bound_under_the_nodes_regime_lets_a_job_run_on_its_most_nodes():
    job = SimJob(1, 0.0, 8, 100.0, LINEAR, SPEC)          # 2 nodes of 4, may grow to 4
    assert run([job], SimPolicy.STATIC).lower_bound_makespan_s == pytest.approx(100.0)
    r = run([job])
    assert r.lower_bound_makespan_s == pytest.approx(50.0) == r.makespan_s


def test_a_node_resize_costs_its_job_a_pause_with_its_cores_held():
    # As above, A gives a node to B at 10 and takes it back at 20; each change pauses A 5 s.
    from malleable_sim import ResizeCosts
    a = SimJob(1, 0.0, 16, 100.0, LINEAR, SPEC)
    b = SimJob(2, 10.0, 4, 10.0, LINEAR)
    free = run([a, b])
    costly = run([a, b], resize_costs=ResizeCosts(node_s=5.0))
    assert ends(costly)[2] == pytest.approx(20.0)       # B itself waits for nothing more
    # A lost 5 s on 12 cores and 5 s on 16, 60 + 80 work units, which it does on 16 cores at
    # the end: it ends 140 / 16 = 8.75 s later.
    assert ends(costly)[1] == pytest.approx(ends(free)[1] + 140 / 16)
    assert costly.paused_core_s == pytest.approx(5 * 12 + 5 * 16)
    assert costly.node_resize_cost_s == 5.0 and free.paused_core_s == 0.0
    with pytest.raises(ValueError):
        ResizeCosts(node_s=-1.0)


def test_a_core_move_costs_its_job_a_pause():
    # Alone on a 4-core node, A (2 cores asked, up to the node) is grown to 4 when it starts;
    # at 0.5 s a move, it ends 0.5 s later than free moves let it.
    from malleable_sim import ResizeCosts
    a = SimJob(1, 0.0, 2, 100.0, LINEAR, MalleableSpec(min_cpus=1))
    free = run([a], SimPolicy.LEND_IDLE, nodes=1, cores=4)
    costly = run([a], SimPolicy.LEND_IDLE, nodes=1, cores=4,
                 resize_costs=ResizeCosts(core_s=0.5))
    assert ends(free)[1] == pytest.approx(50.0)        # 200 work units on 4 cores
    assert ends(costly)[1] == pytest.approx(50.5)
    assert costly.paused_core_s == pytest.approx(4 * 0.5)


def test_an_enforced_time_limit_ends_a_job_its_shrink_made_late():
    # As above, A (limit 100 s) gives B a node for 10 s and so needs 102.5 s: under Slurm's
    # rule it ends at 100 s with its work unfinished; ignored (round 2), it runs to 102.5 s.
    from malleable_sim import TimeLimits
    a = SimJob(1, 0.0, 16, 100.0, LINEAR, SPEC)
    b = SimJob(2, 10.0, 4, 10.0, LINEAR)
    ignored = run([a, b])
    enforced = run([a, b], time_limits=TimeLimits.ENFORCED)
    assert ends(ignored)[1] == pytest.approx(102.5) and ignored.timed_out_jobs == 0
    assert ends(enforced)[1] == pytest.approx(100.0)
    timed_out = {j.job_id: j.timed_out for j in enforced.per_job}
    assert timed_out == {1: True, 2: False} and enforced.timed_out_jobs == 1
    # The kill is not an early finish: A lost its work and runs again at its size, so its
    # response counts 100 + 100 s, and the mean is worse than running past the limit.
    assert enforced.mean_response_s == pytest.approx((200.0 + (ends(enforced)[2] - 10.0)) / 2)
    assert enforced.mean_response_s > ignored.mean_response_s
    # Static never meets a limit its log gave: a job ending exactly at it completes.
    static = run([a, b], SimPolicy.STATIC, time_limits=TimeLimits.ENFORCED)
    assert static.timed_out_jobs == 0 and ends(static) == {1: 100.0, 2: 110.0}


def test_a_job_that_gave_a_node_back_waits_out_its_hold_off_before_growing_again():
    # As above, but A may not grow for 30 s after giving B its node at 10: B ends at 20, the
    # idle node goes back to A at 40. A: 160 units by 10, 12 cores x 30 s, then 16 cores.
    a = SimJob(1, 0.0, 16, 100.0, LINEAR, SPEC)
    b = SimJob(2, 10.0, 4, 10.0, LINEAR)
    r = run([a, b], node_bounds=NodeBounds(regrow_after_s=30.0))
    assert ends(r)[2] == pytest.approx(20.0)
    assert ends(r)[1] == pytest.approx(40.0 + (1600 - 160 - 360) / 16)
    assert r.resizes == 2
