"""Every priority input is the user's word (weight=, min=/max=/cpus= in the Comment, the steps/s
of its own status records): what bounds them. The issue's scenario rebuilt: a 16-core node, two
malleable jobs of 3 cores each (10 idle), one honest (linear), one that lies. Before these
bounds the liar took all 10 idle cores under both policies (see the report of the change)."""
import json
import random
from pathlib import Path

import pytest

from malleable_protocol import ProtocolError
from slurm_plugin.node.cgroup_actuator import CgroupJob
from slurm_plugin.node.config import AgentConfig
from slurm_plugin.node.ledger import Ledger
from malleable_policy.model import (JobView, NodeSnapshot, Plan, PlanInvariantError, Policy,
                                            RankView, SiteLimits, check_plan)
from slurm_plugin.node.observe import NodeObserver
from malleable_policy.decide import LINEAR_GAIN, decide
from malleable_policy.request import MalleableSpec
from slurm_plugin.feed import FeedJob, NodeFeed
from slurm_plugin.feed.model import partition_name
from slurm_plugin.feed.watcher import build_feeds
from slurm_plugin.slurm.client import CliSlurmClient
from slurm_plugin.slurm.parsers import parse_nodes_json, parse_squeue_json

FIX = Path(__file__).parents[2] / "fixtures"
CPUS16 = frozenset(range(16))
HONEST = {1: 10.0, 2: 20.0, 3: 30.0}        # measured, linear
LIAR = {1: 1.0, 2: 1e8}                      # the claim
SITE = AgentConfig(node="n").limits          # what a site that set nothing gets


def job(jid, alloc, rates=None, weight=1, req=None, partition="", lo=1, hi=None):
    return JobView(job_id=jid, uid=1000 + jid, user=f"u{jid}", allocation=frozenset(alloc),
                   current=frozenset(alloc), spec=MalleableSpec(lo, hi, weight), requested=req,
                   partition=partition,
                   ranks=(RankView(pid=100 + jid, rank=0, local_rank=0, local_size=1,
                                   intra_active=len(alloc), steps_per_s=rates),) if rates else ())


def sizes(snapshot, policy):
    t = decide(snapshot, policy).targets
    return {jid: len(c) for jid, c in t.items()}


# --- the scenario ----------------------------------------------------------------------

@pytest.mark.parametrize("liar_weight", [1, 100])
@pytest.mark.parametrize("liar_rates", [LIAR, HONEST, None])
@pytest.mark.parametrize("liar_id", [1, 2])     # the tie-break is the lowest id: both sides
def test_the_liar_gets_no_more_idle_cores_than_the_honest_job(liar_weight, liar_rates, liar_id):
    honest_id = 3 - liar_id
    jobs = (job(liar_id, range(3 * (liar_id - 1), 3 * liar_id), liar_rates, weight=liar_weight),
            job(honest_id, range(3 * (honest_id - 1), 3 * honest_id), HONEST))
    snap = NodeSnapshot("n", CPUS16, tuple(sorted(jobs, key=lambda j: j.job_id)), limits=SITE)
    for policy in (Policy.LEND_IDLE, Policy.THROUGHPUT):
        assert sizes(snap, policy) == {1: 8, 2: 8}, policy    # 5 idle cores each


def test_a_superlinear_claim_counts_as_linear_without_any_site_setting():
    # The linear cap is the policy's own: no site limit needed under throughput.
    snap = NodeSnapshot("n", CPUS16, (job(1, range(3), HONEST), job(2, range(3, 6), LIAR)))
    assert sizes(snap, Policy.THROUGHPUT) == {1: 8, 2: 8}
    # An honest job whose measured curve is superlinear is counted as linear too: it shares
    # the idle cores with a linear job of the same allocation instead of taking them all.
    steep = job(2, range(3, 6), {3: 30.0, 4: 60.0})
    snap = NodeSnapshot("n", CPUS16, (job(1, range(3), HONEST), steep))
    assert sizes(snap, Policy.THROUGHPUT) == {1: 8, 2: 8}
    assert LINEAR_GAIN == 1.0


def test_no_claim_beats_an_honest_linear_job_of_the_same_allocation():
    rng = random.Random(5)
    for _ in range(300):
        n_alloc = rng.randint(1, 4)
        n = rng.randint(2 * n_alloc, 24)
        claim = {k: rng.choice([rng.uniform(0.001, 100.0), 10.0 ** rng.randint(-3, 12)])
                 for k in rng.sample(range(1, 12), rng.randint(1, 4))}
        liar_id = rng.choice([1, 2])
        liar = job(liar_id, range(n_alloc) if liar_id == 1 else range(n_alloc, 2 * n_alloc),
                   claim)
        honest = job(3 - liar_id, range(n_alloc, 2 * n_alloc) if liar_id == 1 else range(n_alloc),
                     {k: 10.0 * k for k in range(1, n_alloc + 1)})
        snap = NodeSnapshot("n", frozenset(range(n)), tuple(sorted((liar, honest),
                                                                   key=lambda j: j.job_id)))
        got = sizes(snap, Policy.THROUGHPUT)
        # Ties (fewest cores per allocated core, then the lowest id) as before: +1 at most,
        # and only when the liar has the lower id.
        assert got[liar_id] <= got[3 - liar_id] + (liar_id == 1), (claim, n, n_alloc, got)


def test_honest_sublinear_jobs_are_sized_as_before():
    # The cap changes nothing for a job whose gains are below linear (the existing tests and the
    # simulator keep their numbers): the one that scales better still gets the idle cores first.
    good = job(1, range(3), {3: 30.0, 4: 38.0})
    poor = job(2, range(3, 6), {3: 30.0, 4: 33.0})
    snap = NodeSnapshot("n", frozenset(range(10)), (good, poor))
    assert sizes(snap, Policy.THROUGHPUT) == {1: 7, 2: 3}


# --- the per-job limit on borrowed cores -------------------------------------------------------

def test_what_a_claim_of_linear_scaling_still_wins_is_bounded_by_the_borrow_limit():
    # Claiming linear scaling is what a job that reports nothing is assumed to do, so the
    # linear cap cannot tell it from the truth: against an honest sublinear job it takes the
    # idle cores, as many as the site lets one job borrow.
    sublinear = job(1, range(3), {1: 10.0, 2: 18.0, 3: 25.0})
    claims_linear = job(2, range(3, 6), HONEST)
    snap = NodeSnapshot("n", CPUS16, (sublinear, claims_linear))
    assert sizes(snap, Policy.THROUGHPUT) == {1: 3, 2: 13}
    capped = NodeSnapshot("n", CPUS16, (sublinear, claims_linear),
                          limits=SiteLimits(max_borrowed_cpus=5))
    assert sizes(capped, Policy.THROUGHPUT) == {1: 8, 2: 8}


@pytest.mark.parametrize("policy", list(Policy))
def test_a_request_or_a_raised_min_borrows_no_more_than_the_site_allows(policy):
    limits = SiteLimits(max_borrowed_cpus=2)
    for asker in (job(2, range(3, 6), HONEST, req=16), job(2, range(3, 6), HONEST, lo=13),
                  job(2, range(3, 6), LIAR, weight=100)):
        snap = NodeSnapshot("n", CPUS16, (job(1, range(3), HONEST), asker), limits=limits)
        got = sizes(snap, policy)
        assert got[2] <= 3 + 2 and got[1] <= 3 + 2
        if policy is not Policy.STATIC:
            assert got[1] == 5        # the honest job borrows its 2 as well
        # Without the limit, a request (or min=) takes every idle core, under any policy.
        free = sizes(NodeSnapshot("n", CPUS16, (job(1, range(3), HONEST), asker)), policy)
        if asker.requested or asker.spec.min_cpus > 3:
            assert free[2] == 13
    with pytest.raises(PlanInvariantError, match="borrowing limit"):
        check_plan(snap, Plan("n", Policy.LEND_IDLE, {1: frozenset(range(3)),
                                                      2: frozenset(range(3, 9))}, {}, ()))


@pytest.mark.parametrize("policy", list(Policy))
def test_random_snapshots_never_borrow_above_the_limit(policy):
    rng = random.Random(13)
    for _ in range(300):
        n = rng.randint(1, 16)
        cap = rng.randint(0, 4)
        jobs, pos, jid = [], 0, 1
        while pos < n and rng.random() < 0.8:
            size = rng.randint(1, min(4, n - pos))
            lo = rng.randint(1, 8)
            jobs.append(job(jid, range(pos, pos + size),
                            {k: rng.uniform(1, 1e6) for k in rng.sample(range(1, 9), 2)},
                            weight=rng.randint(1, 100), req=rng.choice([None, rng.randint(1, 20)]),
                            lo=lo, hi=rng.choice([None, lo + rng.randint(0, 8)])))
            pos += size
            jid += 1
        snap = NodeSnapshot("n", frozenset(range(n)), tuple(jobs),
                            limits=SiteLimits(max_borrowed_cpus=cap))
        for j, c in zip(jobs, (len(decide(snap, policy).targets[j.job_id]) for j in jobs)):
            assert c <= len(j.allocation) + cap       # check_plan inside decide says so too


# --- the weight: the site's, not the user's ----------------------------------------------------

def test_a_users_weight_counts_only_up_to_the_sites_maximum():
    heavy = job(2, range(3, 6), HONEST, weight=100, partition="debug")
    plain = job(1, range(3), HONEST, partition="debug")
    snap = NodeSnapshot("n", CPUS16, (plain, heavy), limits=SITE)
    assert sizes(snap, Policy.LEND_IDLE) == {1: 8, 2: 8}
    # The pure default (no site limits: the simulator, the older tests) believes it.
    assert sizes(NodeSnapshot("n", CPUS16, (plain, heavy)), Policy.LEND_IDLE) == {1: 3, 2: 13}


def test_the_sites_partition_table_lets_an_admin_set_weight_count():
    config = AgentConfig(node="n", partition_max_weight={"prio": 3})
    heavy = job(2, range(3, 6), HONEST, weight=100, partition="prio")   # counts as 3
    plain = job(1, range(3), HONEST, weight=100, partition="debug")     # counts as 1
    snap = NodeSnapshot("n", CPUS16, (plain, heavy),
                        limits=SiteLimits(max_weight=1, partition_max_weight={"prio": 3}))
    assert sizes(snap, Policy.LEND_IDLE) == {1: 4, 2: 12}     # 10 idle: 1 and 9 (weights 1:3)
    assert config.limits.weight(heavy) == 3 and config.limits.weight(plain) == 1
    # Within the partition's maximum the user's own weight counts as given.
    assert config.limits.weight(job(3, {6}, weight=2, partition="prio")) == 2
    # The default borrow limit (8) applies on top: a weight never lifts it.
    snap = NodeSnapshot("n", CPUS16, (plain, heavy), limits=config.limits)
    assert sizes(snap, Policy.LEND_IDLE) == {1: 5, 2: 11}


# --- the site's settings: config, feed, observer ----------------------------------------------

def test_agent_config_defaults_and_json():
    c = AgentConfig(node="n")
    assert (c.max_borrowed_cpus, c.max_weight, dict(c.partition_max_weight)) == (8, 1, {})
    c = AgentConfig(node="n", max_borrowed_cpus=None, max_weight=2,
                    partition_max_weight={"prio": 50})
    assert AgentConfig.from_json(c.to_json()) == c
    assert c.limits == SiteLimits(None, 2, {"prio": 50})
    # An agent.json written before these settings existed: the safe defaults.
    old = {k: v for k, v in json.loads(AgentConfig(node="n").to_json()).items()
           if k not in ("max_borrowed_cpus", "max_weight", "partition_max_weight")}
    assert AgentConfig.from_json(json.dumps(old)).limits == SiteLimits(8, 1, {})
    for bad in ({"max_borrowed_cpus": -1}, {"max_borrowed_cpus": True}, {"max_weight": 0},
                {"max_weight": 101}, {"partition_max_weight": {"p": 0}},
                {"partition_max_weight": {"p": "5"}}, {"partition_max_weight": ["p"]}):
        with pytest.raises(ValueError):
            AgentConfig(node="n", **bad)


@pytest.mark.parametrize("version,nodes_file", [("slurm-22.05", "sinfo.json"),
                                                ("slurm-24.11", "scontrol_show_nodes.json")])
def test_the_feed_carries_each_jobs_partition_from_captured_squeue(version, nodes_file):
    nodes = parse_nodes_json((FIX / version / nodes_file).read_text())
    jobs = CliSlurmClient()._with_cpu_ids(
        parse_squeue_json((FIX / version / "squeue.json").read_text()), nodes)
    feeds = build_feeds(jobs, nodes, 1.0)
    carried = [fj for f in feeds.values() for fj in f.jobs]
    assert carried and {fj.partition for fj in carried} == {"debug"}
    for feed in feeds.values():
        assert NodeFeed.decode(feed.encode()) == feed


def test_a_feed_job_partition_is_bounded():
    base = FeedJob(5, 1000, "u", frozenset({0}), ("n1",), MalleableSpec(), partition="gpu-a.1")
    assert FeedJob.from_dict(base.to_dict()) == base
    older = {k: v for k, v in base.to_dict().items() if k != "partition"}
    assert FeedJob.from_dict(older).partition == ""
    for bad in ("a,b", "a b", "x" * 65, 7, None, ["p"], "p\n", "é"):
        with pytest.raises(ProtocolError):
            FeedJob.from_dict({**base.to_dict(), "partition": bad})
    # What the watcher writes never fails to decode: a name it cannot carry becomes "" (the
    # site's default weight limit, never a partition's).
    assert partition_name("debug") == "debug" and partition_name("a,b") == "" and \
        partition_name("x" * 65) == ""


def test_the_observer_passes_the_sites_limits_and_the_partition():
    from ..fakes import FakeCgroups, FakeFeed
    from malleable_protocol import RunLayout
    feed = NodeFeed("n1", 4, (FeedJob(7, 1000, "u", frozenset({0}), ("n1",), MalleableSpec(),
                                      partition="prio"),))
    cg = {7: CgroupJob(1000, 7, frozenset({0}), {"step_0": frozenset({0})})}
    limits = AgentConfig(node="n1", partition_max_weight={"prio": 4}).limits
    obs = NodeObserver("n1", RunLayout(Path("/nonexistent")), FakeFeed(feed), FakeCgroups(cg),
                       limits=limits, read_ranks=lambda *a: (), wall=lambda: 1000.0)
    snap = obs.observe(Ledger())
    assert snap.limits == limits and snap.job(7).partition == "prio"


def test_ranks_a_job_claims_are_bounded_by_the_records_it_can_have():
    """Issue 40, finding 6: each record's local_size (up to 4,096) in each of many steps was
    expanded into per-rank tuples several times a cycle, outside the read budget (100 steps:
    about 0.3 s of root CPU per decide here, 1,000 steps 2.6 s). A job's folder holds at most
    1,024 records, so no more of its ranks can be managed on the node: beyond that, the ranks
    that reported count. An honest job of 4 ranks in 2 steps counts as it says, reported or
    not yet."""
    from malleable_protocol.records import MAX_RANK_RECORDS
    S = frozenset

    def job(claims: list[tuple[str, int, int]]) -> JobView:
        ranks = tuple(RankView(pid=100 + i, rank=i, local_rank=lr, local_size=size,
                               intra_active=1, step=step)
                      for i, (step, lr, size) in enumerate(claims))
        return JobView(5, 1000, "u", S({0, 1}), S({0, 1}), spec=MalleableSpec(1, None),
                       ranks=ranks, steps=tuple(sorted({c[0] for c in claims})))
    liar = job([(f"step_{i}", 0, 4096) for i in range(1000)])
    assert sum(liar.ranks_per_step.values()) == 1000 <= MAX_RANK_RECORDS
    assert len(liar.threads_per_rank(S(range(8)))) == 1000
    plan = decide(NodeSnapshot("n1", S(range(8)), (liar,)), Policy.LEND_IDLE)
    assert plan.targets[5] <= S(range(8))
    honest = job([("step_0", 0, 2), ("step_1", 0, 2), ("step_1", 1, 2)])   # one yet to report
    assert honest.ranks_per_step == {"step_0": 2, "step_1": 2}


@pytest.mark.parametrize("policy", [Policy.LEND_IDLE, Policy.THROUGHPUT])
def test_the_borrowing_limit_is_one_users_for_all_his_jobs(policy):
    """Issue 40, bounds per user: a 16-core node, three 2-core jobs of one user and one of
    another, the site's limit 4. One job each, he borrowed 4 per job (12 in all); now 4 in all,
    whatever his jobs ask (cpus=, min=) or claim, and the other user's job still gets its 4."""
    from dataclasses import replace
    jobs = (replace(job(1, {0, 1}, LIAR), uid=1000),
            replace(job(2, {2, 3}, req=16), uid=1000),
            replace(job(3, {4, 5}, lo=5), uid=1000),
            replace(job(4, {6, 7}, HONEST), uid=2000))
    plan = decide(NodeSnapshot("n1", CPUS16, jobs, limits=SiteLimits(max_borrowed_cpus=4)),
                  policy)
    borrowed = {j.job_id: len(plan.targets[j.job_id]) - 2 for j in jobs}
    assert sum(borrowed[j] for j in (1, 2, 3)) == 4 and borrowed[4] == 4, borrowed
    assert all(n >= 0 for n in borrowed.values())
