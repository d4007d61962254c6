"""Deciding in whole cores on hyperthreaded nodes (malleable_policy/whole_cores.py): a core's
threads go together, never one to each of two jobs."""
from __future__ import annotations

import random

import pytest

from malleable_policy.model import JobView, NodeSnapshot, Policy, RankView
from malleable_policy.request import MalleableSpec
from malleable_policy.whole_cores import CoreMap, SplitCores, core_snapshot, decide_whole_cores

S = frozenset
# Four cores of two threads numbered as Intel servers do: core k holds CPUs k and k + 4.
CORES = tuple(S({k, k + 4}) for k in range(4))
NODE = S(range(8))


def job(jid, alloc, *, current=None, spec=MalleableSpec(1, None), ranks=(), steps=(), **kw):
    return JobView(job_id=jid, uid=1000 + jid, user=f"u{jid}", allocation=S(alloc),
                   current=S(alloc if current is None else current), spec=spec, ranks=ranks,
                   steps=steps, **kw)


def whole(cpus):
    return all(core <= cpus or not core & cpus for core in CORES)


def test_a_growing_job_takes_both_threads_of_each_idle_core():
    snap = NodeSnapshot("n1", NODE, (job(1, {0, 4}), job(2, {1, 5}, spec=None)))
    plan = decide_whole_cores(snap, Policy.LEND_IDLE, CORES)
    assert plan.targets[1] == {0, 4, 2, 6, 3, 7} and plan.targets[2] == {1, 5}
    (grow,) = plan.actions
    assert grow.after == {0, 2, 3, 4, 6, 7} and grow.threads_per_rank == (6,)


def test_two_jobs_share_idle_cores_core_by_core():
    snap = NodeSnapshot("n1", NODE, (job(1, {0, 4}), job(2, {1, 5})))
    plan = decide_whole_cores(snap, Policy.LEND_IDLE, CORES)
    assert len(plan.targets[1]) == len(plan.targets[2]) == 4
    assert all(whole(t) for t in plan.targets.values())
    assert not plan.targets[1] & plan.targets[2]


def test_bounds_requests_and_limits_count_cpus_and_round_to_cores():
    # min=3 CPUs needs 2 cores; max=5 CPUs allows 2 cores (4 CPUs), never a half core more.
    snap = NodeSnapshot("n1", NODE, (job(1, {0, 4}, spec=MalleableSpec(1, 5)),))
    assert decide_whole_cores(snap, Policy.LEND_IDLE, CORES).targets[1] == {0, 4, 1, 5}
    seen = core_snapshot(NodeSnapshot("n1", NODE, (job(1, {0, 4}, spec=MalleableSpec(3, 5),
                                                          requested=3),)), CoreMap(CORES))
    assert (seen.jobs[0].spec.min_cpus, seen.jobs[0].spec.max_cpus) == (2, 2)
    assert seen.jobs[0].requested == 2 and seen.cpus == {0, 1, 2, 3}


def test_concurrent_steps_get_blocks_of_whole_cores_and_threads_follow_cpus():
    ranks = (RankView(pid=10, rank=0, local_rank=0, local_size=1, intra_active=2, step="step_0"),
             RankView(pid=11, rank=1, local_rank=0, local_size=1, intra_active=2, step="step_1"))
    snap = NodeSnapshot("n1", NODE, (job(1, {0, 4, 1, 5}, ranks=ranks,
                                         steps=("step_0", "step_1")),))
    (grow,) = decide_whole_cores(snap, Policy.LEND_IDLE, CORES).actions
    assert grow.after == NODE
    assert all(whole(block) for block in grow.step_cpus.values())
    assert sorted(len(b) for b in grow.step_cpus.values()) == [4, 4]
    assert grow.threads_per_rank == (4, 4)


def test_part_of_a_core_in_an_allocation_is_refused():
    snap = NodeSnapshot("n1", NODE, (job(1, {0}), job(2, {4})))      # one core, two jobs
    with pytest.raises(SplitCores, match="job 1"):
        decide_whole_cores(snap, Policy.LEND_IDLE, CORES)


def test_cores_must_be_disjoint_and_even():
    with pytest.raises(ValueError):
        CoreMap((S({0, 1}), S({1, 2})))
    with pytest.raises(ValueError):
        CoreMap((S({0, 1}), S({2})))


@pytest.mark.parametrize("seed", range(200))
def test_no_core_is_ever_split_between_jobs(seed):
    """Random nodes, jobs, bounds and rates under every policy: every target is whole cores,
    no CPU is in two jobs' targets, and the plan passes the policy's own invariants."""
    rng = random.Random(seed)
    threads = rng.choice((2, 4))
    n_cores = rng.randint(2, 12)
    # Linux numbering: thread t of core k is k + t * n_cores (Intel's).
    cores = tuple(S(k + t * n_cores for t in range(threads)) for k in range(n_cores))
    free = list(range(n_cores))
    rng.shuffle(free)
    jobs = []
    for jid in range(1, rng.randint(1, n_cores) + 1):
        take = [free.pop() for _ in range(min(len(free), rng.randint(1, 2)))]
        if not take:
            break
        alloc = S().union(*(cores[k] for k in take))
        spec = rng.choice((None, MalleableSpec(rng.randint(1, 4), rng.choice((None, 3, 8)))))
        rate = {k: k * rng.uniform(0.5, 2) for k in range(1, 9)}
        ranks = (RankView(pid=jid, rank=0, local_rank=0, local_size=1,
                          intra_active=len(alloc), steps_per_s=rate),)
        jobs.append(job(jid, alloc, spec=spec, ranks=ranks,
                        requested=rng.choice((None, rng.randint(1, 9)))))
    snap = NodeSnapshot("n1", S().union(*cores), tuple(jobs),
                        max_cpus=rng.choice((None, 6)))
    for policy in Policy:
        plan = decide_whole_cores(snap, policy, cores)
        targets = list(plan.targets.values())
        assert all(CoreMap(cores).whole(t) for t in targets), (policy, plan.targets)
        assert sum(map(len, targets)) == len(S().union(*targets)), (policy, plan.targets)
        for j in jobs:
            assert j.allocation <= plan.targets[j.job_id] or j.malleable
