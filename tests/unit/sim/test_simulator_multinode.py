"""Jobs wider than a node in the simulator: Slurm's node selection for them (select_nodes, the
backfill reservation across nodes) and the agents' multi-node sizing (per-rank offers, no node
giving a job more per rank than the smallest offer of its other nodes), through decide."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from malleable_policy.request import MalleableSpec
from malleable_sim import (Amdahl, Backfill, SimJob, SimPolicy, ask_share,
                                    fluid_lower_bound, read_swf, simulate, swf_workload)
from malleable_sim.slurm_standin import peer_cap, select_nodes

LINEAR = Amdahl(serial=0.0, comm=0.0)
NODE = MalleableSpec(min_cpus=1, max_cpus=None)
SWF = Path(__file__).resolve().parents[2] / "fixtures" / "swf" / "handmade.swf.gz"


def by_id(result):
    return {j.job_id: j for j in result.per_job}


@pytest.mark.parametrize("usable,need,expected", [
    ([64, 64, 64], 100, {0: 64, 1: 36}),              # whole nodes, lowest first; the rest
    ([64, 10, 64, 40], 100, {0: 64, 3: 36}),          # the rest where it fits tightest
    ([64, 64, 64], 128, {0: 64, 1: 64}),
    ([40, 30, 50], 100, {2: 50, 0: 40, 1: 10}),       # no idle node: the most free first
    ([40, 30, 20], 100, None)])                       # too few cores in all
def test_slurm_takes_whole_nodes_first_then_the_tightest_fit(usable, need, expected):
    assert select_nodes(usable, need, 64) == expected


def select_directly(usable, need, node_cores):
    """select_nodes' rule spelled out: idle nodes lowest first while the job needs a whole
    one; the rest on the tightest fit (lowest-numbered among equals); else most free first."""
    if sum(usable) < need:
        return None
    chosen = {}
    for node, free in enumerate(usable):
        if need >= node_cores and free == node_cores:
            chosen[node] = node_cores
            need -= node_cores
    if need == 0:
        return chosen
    fits = [(free, node) for node, free in enumerate(usable)
            if free >= need and node not in chosen]
    if fits:
        chosen[min(fits)[1]] = need
        return chosen
    for node in sorted((n for n, f in enumerate(usable) if f > 0 and n not in chosen),
                       key=lambda n: (-usable[n], n)):
        chosen[node] = min(usable[node], need)
        need -= chosen[node]
        if need == 0:
            break
    return chosen


@settings(max_examples=500, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=12), st.integers(1, 50))
def test_the_choice_of_nodes_is_the_rule_spelled_out(usable, need):
    got, expected = select_nodes(usable, need, 4), select_directly(usable, need, 4)
    # In the rule's order too: a reservation numbers its nodes in it.
    assert got == expected and (got is None or list(got.items()) == list(expected.items()))


def test_the_peer_cap_is_the_smallest_offer_of_the_other_nodes():
    assert peer_cap([2, None, 3], 0) == 3
    assert peer_cap([2, None, 3], 2) == 2
    assert peer_cap([None, 5], 1) is None    # no other node has offered yet: no cap
    assert peer_cap([4, 1, 1], 1) == 1       # another node offers as little as this one
    assert peer_cap([7], 0) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(1, 5)), min_size=1, max_size=8), st.data())
def test_the_peer_cap_is_the_rule_spelled_out(offers, data):
    i = data.draw(st.integers(0, len(offers) - 1))
    others = [o for k, o in enumerate(offers) if k != i and o is not None]
    assert peer_cap(offers, i) == (min(others) if others else None)


def test_a_job_wider_than_a_node_runs_on_several():
    wide = SimJob(1, 0.0, 40, 100.0, LINEAR)
    r = simulate([wide, SimJob(2, 0.0, 16, 50.0, LINEAR)], nodes=4, cores=16,
                 policy=SimPolicy.STATIC, backfill_interval_s=1.0)
    j = by_id(r)
    assert (j[1].nodes, j[1].start_s, j[1].end_s) == (3, 0.0, 100.0)   # 16 + 16 + 8
    assert (j[2].nodes, j[2].start_s) == (1, 0.0)                      # the fourth node
    assert r.utilisation == pytest.approx((40 * 100 + 16 * 50) / (64 * 100))
    with pytest.raises(ValueError, match="the cluster has 4 x 16"):
        simulate([SimJob(3, 0.0, 65, 1.0, LINEAR)], nodes=4, cores=16, policy=SimPolicy.STATIC)


def test_a_wide_job_waiting_gets_a_reservation_across_nodes():
    """EASY backfill, 2 nodes x 4 cores. Node 0 is busy until 100 s; a 6-core job then gets
    node 0 whole and 2 cores of node 1 (reserved at 100 s). Behind it, a job may start now on
    node 1's 2 spare cores, or on any cores if it ends by 100 s; a 3-core, 200 s job must
    wait."""
    jobs = [SimJob(1, 0.0, 4, 100.0, LINEAR), SimJob(2, 1.0, 6, 10.0, LINEAR),
            SimJob(3, 2.0, 2, 200.0, LINEAR), SimJob(4, 3.0, 3, 200.0, LINEAR),
            SimJob(5, 4.0, 2, 50.0, LINEAR)]
    j = by_id(simulate(jobs, nodes=2, cores=4, policy=SimPolicy.STATIC, backfill=Backfill.EASY,
                       backfill_interval_s=1.0))
    assert (j[2].start_s, j[2].nodes) == (100.0, 2)
    assert j[3].start_s == 2.0 and j[5].start_s == 4.0
    assert j[4].start_s == 110.0


def test_the_agents_hold_a_multi_node_job_to_its_slowest_nodes_offer():
    """3 nodes x 8 cores, each with a rigid 5-core job (ending at 10, 20, 30 s). A malleable
    9-core MPI job gets 3 cores (3 ranks) on each node. When node 0 frees its 5 cores at 10 s,
    its agent would give the job 2 threads per rank there, but the other nodes offer 1: node 0
    keeps 3 cores for it (a job runs at its slowest rank's pace) and lends the rest to a
    1-core malleable job arriving then, which grows to 5 cores (40 s of work in 8 s). Only
    when every node offers 2 per rank (30 s) does the job grow, on all three."""
    jobs = [SimJob(1, 0.0, 5, 10.0, LINEAR), SimJob(2, 0.0, 5, 20.0, LINEAR),
            SimJob(3, 0.0, 5, 30.0, LINEAR), SimJob(4, 1.0, 9, 100.0, LINEAR, NODE),
            SimJob(5, 10.0, 1, 40.0, LINEAR, NODE)]
    for policy in (SimPolicy.LEND_IDLE, SimPolicy.THROUGHPUT):
        # The main scheduler at every arrival (batch_sched_delay 0): job 4 starts at 1 s.
        r = simulate(jobs, nodes=3, cores=8, policy=policy, backfill_interval_s=1.0,
                     batch_sched_delay_s=0.0)
        j = by_id(r)
        assert j[4].nodes == 3 and j[5].end_s == pytest.approx(18.0)
        # 261 of 900 units done at 9 cores by 30 s; then 2 threads per rank (18 cores) is
        # above the job's maximum on its fewest nodes (2 x 8): 639 units at 16 cores.
        assert j[4].end_s == pytest.approx(30.0 + 639 / 16)
        assert r.resizes == 3
    for policy in (SimPolicy.STATIC, SimPolicy.CGROUP_ONLY):
        j = by_id(simulate(jobs, nodes=3, cores=8, policy=policy, backfill_interval_s=1.0,
                           batch_sched_delay_s=0.0))
        assert j[4].end_s == pytest.approx(101.0) and j[5].end_s == pytest.approx(50.0)
    assert fluid_lower_bound(jobs, 3, 8) <= 30.0 + 639 / 16


def test_a_wide_job_packed_onto_full_nodes_cannot_grow():
    """Slurm packs a 12-core job on 8-core nodes as 8 + 4: the full node offers 1 core per
    rank, so the other node gives it no more than 1 per rank either, however idle."""
    job = SimJob(1, 0.0, 12, 100.0, LINEAR, NODE)
    r = simulate([job], nodes=2, cores=8, policy=SimPolicy.THROUGHPUT, backfill_interval_s=1.0)
    assert r.per_job[0].end_s == pytest.approx(100.0) and r.resizes == 0
    # Asking for less would leave it slower for good: wide jobs keep their size.
    assert ask_share([job], 0.25, 8) == [job]


def test_the_hand_made_log_runs_its_multi_node_jobs_uncapped():
    w = swf_workload(read_swf(SWF.read_bytes()), nodes=8, cores=16, malleable_fraction=0.5,
                     seed=2)
    for policy in SimPolicy:
        r = simulate(list(w.jobs), nodes=8, cores=16, policy=policy)
        j = by_id(r)
        assert r.jobs == 8 and (j[2].nodes, j[8].nodes) == (4, 8)
        assert j[8].start_s >= 200.0 and r.makespan_s >= r.lower_bound_makespan_s * (1 - 1e-9)
