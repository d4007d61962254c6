import random

import pytest

from malleable_policy.model import (ActionKind, JobView, NodeSnapshot, Plan, PlanInvariantError, Policy, Reason,
                                            RankView, check_plan)
from malleable_policy.decide import decide, estimated_rate, measured_points
from malleable_policy.request import (MalleableSpec, RequestError, Update, apply_update,
                                              parse_submit, parse_update)

CPUS8 = frozenset(range(8))


def job(jid, slurm, current=None, spec=None, req=None, rates=None, **kw):
    slurm = frozenset(slurm)
    kw.setdefault("ranks", (RankView(pid=100 + jid, rank=0, local_rank=0, local_size=1,
                                     intra_active=1, steps_per_s=rates),) if rates else ())
    return JobView(job_id=jid, uid=1000, user="u", allocation=slurm,
                   current=frozenset(current) if current is not None else slurm,
                   spec=spec, requested=req, **kw)


M = MalleableSpec  # bounds shorthand


def test_static_keeps_allocations():
    snap = NodeSnapshot("n", CPUS8, (job(1, {0}, spec=M(1, 8)), job(2, {1, 2})))
    plan = decide(snap, Policy.STATIC)
    assert plan.targets == {1: {0}, 2: {1, 2}}


def test_lend_idle_alone_grows_to_node():
    snap = NodeSnapshot("n", CPUS8, (job(1, {0}, spec=M(1, None)),))
    assert decide(snap, Policy.LEND_IDLE).targets[1] == CPUS8


def test_lend_idle_respects_max_and_weights():
    snap = NodeSnapshot("n", CPUS8, (job(1, {0}, spec=M(1, 3)), job(2, {1}, spec=M(1, None, 1)),
                                     job(3, {2}, spec=M(1, None, 2)), job(4, {3})))
    t = decide(snap, Policy.LEND_IDLE).targets
    assert 1 <= len(t[1]) <= 3
    assert t[4] == {3}
    assert sum(len(v) for v in t.values()) == 8
    assert len(t[3]) >= len(t[2])  # weight 2 gets at least as much as weight 1


def test_new_job_takes_back_lent_cores():
    # Job 1 borrowed everything; Slurm started job 2 on cores 4-5: they go back to job 2.
    snap = NodeSnapshot("n", CPUS8, (job(1, {0}, current=CPUS8, spec=M(1, None)),
                                     job(2, {4, 5}, current={4, 5})))
    t = decide(snap, Policy.LEND_IDLE).targets
    assert t[2] == {4, 5}
    assert t[1] == CPUS8 - {4, 5}


def test_explicit_request_shrinks_below_allocation_and_frees_cores():
    snap = NodeSnapshot("n", CPUS8, (job(1, {0, 1, 2, 3}, spec=M(1, None), req=1),
                                     job(2, {4}, spec=M(1, None))))
    t = decide(snap, Policy.LEND_IDLE).targets
    assert len(t[1]) == 1 and t[1] <= {0, 1, 2, 3}
    assert len(t[2]) == 7   # the freed cores and the idle ones


@pytest.mark.parametrize("policy", list(Policy))
def test_no_job_goes_below_its_allocation_unless_its_owner_asks(policy):
    """A max= below what Slurm allocated (or the site's limit below it) never shrinks a job:
    its time limit is for the cores it asked Slurm for. Its owner's cpus= still may."""
    jobs = (job(1, {0, 1, 2, 3}, spec=M(1, 2), rates={1: 5.0, 4: 6.0}),
            job(2, {4}, spec=M(1, None), rates={1: 5.0, 2: 10.0}))
    for snap in (NodeSnapshot("n", CPUS8, jobs),
                 NodeSnapshot("n", CPUS8, jobs, max_cpus=2)):
        assert len(decide(snap, policy).targets[1]) == 4
    asked = NodeSnapshot("n", CPUS8, (job(1, {0, 1, 2, 3}, spec=M(1, 2), req=1),))
    assert len(decide(asked, policy).targets[1]) == 1
    with pytest.raises(PlanInvariantError, match="below its allocation, unasked"):
        check_plan(NodeSnapshot("n", CPUS8, jobs),
                   Plan("n", policy, {1: frozenset({0, 1}), 2: frozenset({4})}, {}, ()))


def test_request_clamped_to_bounds_and_node():
    snap = NodeSnapshot("n", CPUS8, (job(1, {0}, spec=M(2, 4), req=100),))
    assert len(decide(snap, Policy.STATIC).targets[1]) == 4
    snap = NodeSnapshot("n", CPUS8, (job(1, {0}, spec=M(2, 4), req=1),))
    assert len(decide(snap, Policy.STATIC).targets[1]) == 2


def test_sets_move_little():
    snap = NodeSnapshot("n", CPUS8, (job(1, {0}, current={0, 5, 6}, spec=M(1, 3)),))
    assert decide(snap, Policy.LEND_IDLE).targets[1] == {0, 5, 6}


def test_throughput_prefers_the_job_that_scales():
    scales = {1: 10.0, 2: 20.0, 4: 40.0}
    flat = {1: 10.0, 2: 10.5, 4: 10.6}
    snap = NodeSnapshot("n", CPUS8, (job(1, {0, 1}, spec=M(1, None), rates=scales),
                                     job(2, {2, 3}, spec=M(1, None), rates=flat)))
    t = decide(snap, Policy.THROUGHPUT).targets
    assert len(t[1]) > len(t[2]) and len(t[2]) >= 1


def test_throughput_counts_a_core_of_a_wide_job_as_much_as_one_of_a_narrow_job():
    # Both scale linearly: each idle core does as much work (core-equivalents) in either, so
    # the 3 idle cores are shared in proportion to the allocations (4:1 of 8 -> 6 and 2). Judged
    # against each job's whole rate, the 1-core job's gain looked 4 times larger and it took all 3.
    wide = job(1, {0, 1, 2, 3}, spec=M(1, None), rates={4: 40.0})
    narrow = job(2, {4}, spec=M(1, None), rates={1: 10.0})
    t = decide(NodeSnapshot("n", CPUS8, (wide, narrow)), Policy.THROUGHPUT).targets
    assert (len(t[1]), len(t[2])) == (6, 2)
    assert t[1] >= {0, 1, 2, 3} and t[2] >= {4}
    # A job that scales worse still loses to one that scales well, whatever their widths.
    flat_wide = job(1, {0, 1, 2, 3}, spec=M(1, None), rates={4: 40.0, 5: 41.0})
    t = decide(NodeSnapshot("n", CPUS8, (flat_wide, narrow)), Policy.THROUGHPUT).targets
    assert (len(t[1]), len(t[2])) == (4, 4)


def test_throughput_gives_no_core_that_slows_a_job_down():
    # Past 2 cores this job trains slower (its own telemetry): throughput stops at 2 and leaves
    # the other cores idle; lend-idle, which does not look at rates, gives it the node.
    peaks = job(1, {0}, spec=M(1, None), rates={1: 10.0, 2: 15.0, 3: 14.0})
    snap = NodeSnapshot("n", CPUS8, (peaks,))
    assert len(decide(snap, Policy.THROUGHPUT).targets[1]) == 2
    assert decide(snap, Policy.LEND_IDLE).targets[1] == CPUS8
    # Its allocation stays its own even where the telemetry says fewer cores would do.
    wide = job(1, {0, 1, 2, 3}, spec=M(1, None), rates={2: 15.0, 4: 14.0})
    assert decide(NodeSnapshot("n", CPUS8, (wide,)), Policy.THROUGHPUT).targets[1] == {0, 1, 2, 3}


def test_estimated_rate():
    pts = measured_points(job(1, {0}, spec=M(), rates={2: 18.0, 1: 10.0}))
    assert pts == ((1, 10.0), (2, 18.0))
    assert estimated_rate(pts, 1) == 10.0 and estimated_rate(pts, 2) == 18.0
    assert estimated_rate(pts, 3) == 26.0           # the last per-core gain
    assert estimated_rate(measured_points(job(1, {0}, spec=M())), 5) == 5.0  # nothing: linear


def random_allocations(rng, n):
    """(job id, allocation) of random jobs on an n-core node, disjoint, in random core order."""
    cpus = list(range(n))
    rng.shuffle(cpus)
    pos, jid = 0, 1
    while pos < n and rng.random() < 0.8:
        size = rng.randint(1, max(1, min(4, n - pos)))
        yield jid, frozenset(cpus[pos:pos + size])
        pos += size
        jid += 1


@pytest.mark.parametrize("policy", list(Policy))
def test_random_snapshots_never_break_invariants(policy):
    rng = random.Random(7)
    for _ in range(400):
        n = rng.randint(1, 16)
        jobs = []
        for jid, slurm in random_allocations(rng, n):
            spec = None
            if rng.random() < 0.7:
                lo = rng.randint(1, 4)
                spec = MalleableSpec(lo, rng.choice([None, lo + rng.randint(0, 8)]),
                                     rng.randint(1, 3))
            current = frozenset(rng.sample(range(n), rng.randint(1, n)))
            jobs.append(job(jid, slurm, current=current, spec=spec,
                            req=rng.choice([None, None, rng.randint(1, 20)]),
                            rates={k: rng.uniform(1, 50) for k in rng.sample(range(1, 9), 2)}))
        snap = NodeSnapshot("n", frozenset(range(n)), tuple(jobs))
        check_plan(snap, decide(snap, policy))   # raises on any broken rule


def test_check_plan_catches_double_booking():
    snap = NodeSnapshot("n", CPUS8, (job(1, {0}, spec=M()), job(2, {1}, spec=M())))
    with pytest.raises(PlanInvariantError, match="core 1 given to jobs 1 and 2"):
        check_plan(snap, Plan("n", Policy.STATIC, {1: frozenset({0, 1}), 2: frozenset({1})}, {}, ()))


@pytest.mark.parametrize("text,spec", [
    ("malleable:", M(1, None, 1)), ("malleable:min=1,max=8", M(1, 8, 1)),
    ("malleable:max=node,min=2,weight=5", M(2, None, 5)),
])
def test_parse_submit(text, spec):
    assert parse_submit(text) == spec
    assert parse_submit(spec.normal_form()) == spec


@pytest.mark.parametrize("bad", [
    "malleable", "malleable:min=0", "malleable:min=3,max=2", "malleable:min=1,min=2",
    "malleable:cpus=2", "malleable:min=1 ,max=2", "malleable:min=1,max=2;rm", "malleable:x=1",
    "malleable:min=node", "malleable:weight=101", "malleable:min=99999", "malleable:min=1,",
])
def test_parse_submit_refuses(bad):
    with pytest.raises(RequestError):
        parse_submit(bad)


def test_parse_and_apply_update():
    assert parse_update("malleable:cpus=4") == Update(cpus=4)
    up = parse_update("malleable:min=2,max=node")
    assert apply_update(M(1, 4), up) == M(2, None)
    assert apply_update(M(1, 4), parse_update("malleable:cpus=3")) == M(1, 4)
    for bad in ["malleable:", "malleable:weight=2", "malleable:cpus=0", "malleable:cpus=two"]:
        with pytest.raises(RequestError):
            parse_update(bad)
    with pytest.raises(RequestError):
        apply_update(M(1, 4), parse_update("malleable:min=6"))


def ranks(n):
    return tuple(RankView(pid=10 + r, rank=r, local_rank=r, local_size=n, intra_active=1)
                 for r in range(n))


def test_three_cores_two_ranks_each_rank_is_told_the_cores_it_holds():
    from malleable_runtime.allowance import Allowance, share_of
    snap = NodeSnapshot("n", frozenset(range(3)),
                        (job(1, {0}, spec=M(1, None), ranks=ranks(2)),))
    (a,) = decide(snap, Policy.LEND_IDLE).actions
    assert a.after == {0, 1, 2} and a.threads_per_rank == (2, 1)
    # Each rank takes its share of that cpuset with the same split (malleable_tf's side).
    assert [len(share_of(Allowance(a.after), r, 2)) for r in range(2)] == [2, 1]


def test_a_starting_job_brings_every_lent_core_back_and_freezes_lending():
    snap = NodeSnapshot("n", CPUS8, (job(1, {0}, current={0, 1, 2, 3}, spec=M(1, None)),
                                     job(2, {4}, current={4, 5}, spec=M(1, None), req=3),
                                     job(3, {6})), pending_starts=(9,))
    plan = decide(snap, Policy.LEND_IDLE)
    assert plan.targets[1] == {0} and plan.targets[2] == {4}    # idle cores stay idle
    assert {a.job_id: a.reason for a in plan.actions} == {1: Reason.RECLAIM, 2: Reason.RECLAIM}
    assert all(a.kind is ActionKind.SHRINK for a in plan.actions)


def test_a_job_without_a_folder_keeps_its_cores_reserved():
    snap = NodeSnapshot("n", frozenset(range(4)), (job(1, {0}, spec=M(1, None)),
                                                   job(2, {1, 2}, has_folder=False)))
    plan = decide(snap, Policy.LEND_IDLE)
    assert plan.targets == {1: {0, 3}, 2: {1, 2}}
    assert [a.job_id for a in plan.actions] == [1]


def test_multi_node_job_gets_no_more_per_rank_than_its_slowest_node():
    # Job 1 runs on two nodes; the other node offers it 1 core per rank. Here it would get 2,
    # but the surplus goes to job 2.
    def mk(cap):
        return NodeSnapshot("n", frozenset(range(4)), (
            job(1, {0}, spec=M(1, None), nodes=2, peer_cap_per_rank=cap),
            job(2, {1}, spec=M(1, None))))
    free = decide(mk(None), Policy.LEND_IDLE)
    assert len(free.targets[1]) == 2 and len(free.targets[2]) == 2 and free.offers == {1: 2}
    capped = decide(mk(1), Policy.LEND_IDLE)
    assert capped.targets[1] == {0} and capped.targets[2] == {1, 2, 3}
    assert capped.offers == {1: 2}          # what this node would give, uncapped
    assert capped.reasons[1] is Reason.PEER_CAP
    # The cap never takes a job below its own allocation.
    own = NodeSnapshot("n", frozenset(range(4)), (job(1, {0, 1}, spec=M(1, None), nodes=2,
                                                      peer_cap_per_rank=1),))
    assert decide(own, Policy.LEND_IDLE).targets[1] == {0, 1}


def test_check_plan_refuses_a_job_above_its_maximum():
    snap = NodeSnapshot("n", CPUS8, (job(1, {0}, spec=M(1, 2)),))
    with pytest.raises(PlanInvariantError, match="maximum"):
        check_plan(snap, Plan("n", Policy.LEND_IDLE, {1: frozenset({0, 1, 2})}, {}, ()))


@pytest.mark.parametrize("policy", list(Policy))
def test_random_snapshots_with_starts_peers_and_ranks_never_break_invariants(policy):
    rng = random.Random(11)
    for _ in range(300):
        n = rng.randint(1, 12)
        jobs = []
        for jid, alloc in random_allocations(rng, n):
            spec = MalleableSpec(rng.randint(1, 3), rng.choice([None, rng.randint(3, 9)])) \
                if rng.random() < 0.7 else None
            jobs.append(job(jid, alloc, current=frozenset(rng.sample(range(n), rng.randint(1, n))),
                            spec=spec, req=rng.choice([None, rng.randint(1, 12)]),
                            ranks=ranks(rng.randint(1, 3)), has_folder=rng.random() < 0.9,
                            nodes=rng.choice([1, 2]),
                            peer_cap_per_rank=rng.choice([None, rng.randint(1, 4)])))
        snap = NodeSnapshot("n", frozenset(range(n)), tuple(jobs),
                            pending_starts=rng.choice([(), (99,)]))
        plan = decide(snap, policy)          # check_plan runs inside
        for a in plan.actions:
            assert sum(a.threads_per_rank) >= len(a.threads_per_rank)


def test_a_job_lying_about_its_rate_wins_idle_cores_only():
    liar = job(1, {0, 1}, spec=M(1, None), rates={1: 1.0, 2: 1000.0})
    honest = job(2, {2, 3}, spec=M(1, None), rates={1: 10.0, 2: 11.0})
    plan = decide(NodeSnapshot("n", frozenset(range(6)), (liar, honest)), Policy.THROUGHPUT)
    assert plan.targets[2] >= {2, 3}              # its allocation stays its own
    assert plan.targets[1] == {0, 1, 4, 5}         # the liar got the idle cores, nothing more


def test_max_node_is_held_to_the_sites_limit():
    snap = NodeSnapshot("n", CPUS8, (job(1, {0}, spec=M(1, None)),), max_cpus=3)
    assert len(decide(snap, Policy.LEND_IDLE).targets[1]) == 3
    with pytest.raises(PlanInvariantError, match="maximum"):
        check_plan(snap, Plan("n", Policy.LEND_IDLE, {1: frozenset(range(5))}, {}, ()))


def test_a_fenced_job_goes_back_to_exactly_its_allocation():
    # Job 1 grew over the node; a step starts in it: slurmstepd is about to write its folder
    # back to the allocation, so the plan does it first (ranks told), and lends nothing to it.
    snap = NodeSnapshot("n", CPUS8, (job(1, {0, 1}, current=CPUS8, spec=M(1, None), req=6,
                                         fenced=True),
                                     job(2, {4}, spec=M(1, None))))
    plan = decide(snap, Policy.LEND_IDLE)
    assert plan.targets[1] == {0, 1} and plan.reasons[1] is Reason.STEP_START
    (a,) = [a for a in plan.actions if a.job_id == 1]
    assert a.kind is ActionKind.SHRINK and a.after == {0, 1}
    # A fenced job that had lent part of its allocation gets all of it back (slurmstepd will
    # write the whole allocation).
    snap = NodeSnapshot("n", CPUS8, (job(1, {0, 1, 2, 3}, current={0}, spec=M(1, None),
                                         fenced=True),
                                     job(2, {4}, current={1, 2, 3, 4, 5, 6, 7},
                                         spec=M(1, None))))
    t = decide(snap, Policy.THROUGHPUT).targets
    assert t[1] == {0, 1, 2, 3} and not t[2] & t[1]
    snap = NodeSnapshot("n", CPUS8, (job(1, {0, 1}, current={0, 1, 2}, spec=M(1, None)),))
    bad = Plan("n", Policy.LEND_IDLE, {1: frozenset({0, 1, 2})}, {}, ())
    check_plan(snap, bad)
    with pytest.raises(PlanInvariantError):
        check_plan(NodeSnapshot("n", CPUS8, (job(1, {0, 1}, current={0, 1, 2}, spec=M(1, None),
                                                 fenced=True),)), bad)


def test_ranks_of_concurrent_steps_get_disjoint_blocks_in_proportion():
    from malleable_policy.model import split_among_steps
    ranks = (RankView(pid=10, rank=0, local_rank=0, local_size=1, intra_active=1, step="step_0"),
             RankView(pid=11, rank=0, local_rank=0, local_size=2, intra_active=1, step="step_1"),
             RankView(pid=12, rank=1, local_rank=1, local_size=2, intra_active=1, step="step_1"))
    j = job(1, {0, 1}, current=set(range(6)), spec=M(1, None), ranks=ranks)
    split = j.step_cpus(frozenset(range(6)))
    assert split == {"step_0": {0, 1}, "step_1": {2, 3, 4, 5}}
    assert j.local_size == 3 and j.threads_per_rank(frozenset(range(6))) == (2, 2, 2)
    # The plan carries the blocks; one step with ranks (a batch shell waiting on srun has none)
    # needs none.
    plan = decide(NodeSnapshot("n", frozenset(range(6)), (j,)), Policy.LEND_IDLE)
    assert plan.actions == () or all(a.step_cpus == split for a in plan.actions)
    assert split_among_steps(frozenset(range(6)), {"step_batch": 1}) == {}
    # Steps in step order (10 after 9, batch first); fewer cores than ranks: they share.
    assert split_among_steps(frozenset({0}), {"step_10": 1, "step_9": 1}) == \
        {"step_9": {0}, "step_10": {0}}
    assert split_among_steps(frozenset(range(4)), {"step_10": 1, "step_batch": 1, "step_9": 2}) \
        == {"step_batch": {0}, "step_9": {1, 2}, "step_10": {3}}


def test_a_new_srun_step_gets_its_own_block_before_its_ranks_report():
    batch_rank = (RankView(pid=10, rank=0, local_rank=0, local_size=1, intra_active=2,
                           step="step_batch"),)
    cpus = frozenset({0, 1})
    # Training in the batch step, a new srun step whose rank has not reported yet: split now.
    j = job(1, {0}, current=cpus, spec=M(1, None), ranks=batch_rank,
            steps=("step_batch", "step_3"))
    assert j.step_cpus(cpus) == {"step_batch": {0}, "step_3": {1}}
    assert j.threads_per_rank(cpus) == (1,)
    # A batch shell waiting on its one srun step: no split, the step keeps all the cores.
    j = job(1, {0}, current=cpus, spec=M(1, None), steps=("step_batch", "step_0"))
    assert j.step_cpus(cpus) == {}
    # Two new sruns from the shell, neither reported yet: one core each from the start.
    j = job(1, {0}, current=cpus, spec=M(1, None), steps=("step_batch", "step_3", "step_4"))
    assert j.step_cpus(cpus) == {"step_3": {0}, "step_4": {1}}


def test_the_fast_helpers_give_what_the_direct_rules_give():
    """_water_fill's heap and _distance_to_nearest's bisect (made for speed) against the rules
    they stand for: a core at a time to the job furthest below its weighted share, lowest id on
    ties; the smallest distance to any core held."""
    from malleable_policy.decide import _distance_to_nearest, _water_fill

    def water_fill_direct(counts, caps, weights, spare):
        counts = dict(counts)
        while spare > 0:
            open_jobs = [j for j in counts if counts[j] < caps[j]]
            if not open_jobs:
                break
            j = min(open_jobs, key=lambda j: (counts[j] / weights[j], j))
            counts[j] += 1
            spare -= 1
        return counts

    rng = random.Random(7)
    for _ in range(3000):
        jobs = rng.sample(range(1, 40), rng.randint(1, 8))
        counts = {j: rng.randint(0, 6) for j in jobs}
        caps = {j: counts[j] + rng.randint(-2, 10) for j in jobs}
        weights = {j: rng.choice([1, 1, 2, 3, 7]) for j in jobs}
        spare = rng.randint(0, 40)
        assert _water_fill(counts, caps, weights, spare) == \
            water_fill_direct(counts, caps, weights, spare)
        held = sorted(rng.sample(range(64), rng.randint(0, 10)))
        c = rng.randrange(64)
        assert _distance_to_nearest(held, c) == min((abs(c - m) for m in held), default=0)


def test_a_jobs_steps_per_s_is_the_mean_over_its_ranks_of_the_counts_all_measured():
    """JobView.steps_per_s (one rank: its own counts, a shortcut made for speed) against the
    rule: by node cores (ranks x threads), the mean over the ranks, only where every rank has a
    value; the same floats (-0.0 and ints included)."""
    def direct(ranks):
        n = len(ranks)
        keys = set.intersection(*(set(r.steps_per_s) for r in ranks)) if ranks else set()
        return {k * n: sum(r.steps_per_s[k] for r in ranks) / n for k in keys}

    rng = random.Random(11)
    for _ in range(2000):
        ranks = tuple(RankView(pid=1 + i, rank=i, local_rank=i, local_size=1, intra_active=1,
                               steps_per_s={k: rng.choice([rng.uniform(0, 50), -0.0, 0, 7])
                                            for k in rng.sample(range(1, 9), rng.randint(0, 4))})
                      for i in range(rng.choice([0, 1, 1, 2, 3])))
        got = job(1, {0}, spec=M(), ranks=ranks).steps_per_s
        want = direct(ranks)
        assert got == want
        assert [repr(got[k]) for k in sorted(got)] == [repr(want[k]) for k in sorted(want)]
