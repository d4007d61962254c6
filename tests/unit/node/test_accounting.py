"""Accounting of borrowed and lent cores: the pure integral against a direct one, the ledger's
bounded encoding of it, the reconciler's cycle and the Epilog's close, `malleable status` and
the metrics."""
import json
import math
import os
import time

import pytest
from hypothesis import example, given, settings, strategies as st

from malleable_protocol.records import ProtocolError
from slurm_plugin.hooks import job_hooks as hooks
from slurm_plugin.node.accounting import (account, account_cycle, close_job, held_after,
                                                 record_cycle, so_far, usage_line)
from slurm_plugin.node.core_usage import CoreUsage
from slurm_plugin.node.config import AgentConfig
from malleable_policy.model import Outcome, OutcomeStatus
from slurm_plugin.hooks.install import prepare_node_folders
from slurm_plugin.node.ledger import Ledger, LedgerCorrupt, LedgerFile
from slurm_plugin.daemon.metrics import AgentMetrics
from malleable_policy.model import (Action, ActionKind, JobView, NodeSnapshot, Reason)
from slurm_plugin.node.reconciler import CycleResult, Reconciler
from malleable_policy.request import MalleableSpec
from slurm_plugin.feed import FeedJob, FeedStore, NodeFeed

S = frozenset
UID = os.geteuid()
PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=300)


# --- the pure integral ------------------------------------------------------------------------

def test_the_first_observation_integrates_nothing():
    u = account(None, 4, 2, 100.0)
    assert u == CoreUsage(allocation=2, width=4, since=100.0, start=100.0)


def test_borrowed_and_lent_are_the_recorded_width_over_the_time_since():
    u = account(None, 4, 2, 100.0)                 # 2 cores above its allocation ...
    u = account(u, 1, 2, 110.0)                    # ... for 10 s, then 1 below
    assert (u.borrowed_core_s, u.lent_core_s) == (20.0, 0.0)
    u = account(u, 2, 2, 115.0)                    # 1 below for 5 s, then exactly it
    assert (u.borrowed_core_s, u.lent_core_s) == (20.0, 5.0)
    u = account(u, 2, 2, 1000.0)
    assert (u.borrowed_core_s, u.lent_core_s, u.start, u.since) == (20.0, 5.0, 100.0, 1000.0)
    assert so_far(account(u, 3, 2, 1000.0), 1002.5).borrowed_core_s == 22.5


def test_a_clock_set_back_integrates_nothing_and_starts_again_from_now():
    u = account(account(None, 4, 2, 100.0), 4, 2, 50.0)
    assert (u.borrowed_core_s, u.since) == (0.0, 50.0)
    assert account(u, 4, 2, 60.0).borrowed_core_s == 20.0
    assert account(u, 4, 2, 50.0).borrowed_core_s == 0.0


def test_negative_cores_are_refused():
    with pytest.raises(ValueError):
        account(None, -1, 2, 0.0)


def direct_integral(t0, steps, alloc):
    """Borrowed and lent of a step timeline [(duration, width), ...] starting at t0, summed
    directly, with no accounting code."""
    above = sum(d * max(0, w - alloc) for d, w in steps)
    below = sum(d * max(0, alloc - w) for d, w in steps)
    return above, below, sum(d * (w - alloc) for d, w in steps)


timelines = st.lists(st.tuples(st.floats(0.0, 3600.0), st.integers(0, 256)),
                     min_size=1, max_size=60)


@PROPERTY
@given(alloc=st.integers(0, 256), t0=st.floats(0.0, 2e9), steps=timelines,
       samples=st.lists(st.integers(0, 4), min_size=60, max_size=60))
@example(alloc=2, t0=0.0, steps=[(10.0, 4), (5.0, 1)], samples=[0] * 60)
def test_accounting_matches_the_direct_integral_of_a_step_timeline(alloc, t0, steps, samples):
    """The width changes at each step's start (a cycle writes it) and is observed again at
    cycles that change nothing (``samples`` extra observations in each step): the accounted
    core-seconds are the integral of the width above and below the allocation, and borrowed -
    lent the integral of width - allocation."""
    times = [t0]                              # each step's start, as wall times
    for d, _ in steps:
        times.append(times[-1] + d)
    u, seen = None, 0
    for (t, t_next, (d, w)), extra in zip(zip(times, times[1:], steps), samples):
        u = account(u, w, alloc, t)
        for k in range(1, extra + 1):         # cycles in between, the width unchanged
            u = account(u, w, alloc, t + (t_next - t) * k / (extra + 1))
        seen += 1 + extra
    t = times[-1]
    u = so_far(u, t)
    real = [(t1 - t0_, w) for t0_, t1, (_, w) in zip(times, times[1:], steps)]
    above, below, net = direct_integral(t0, real, alloc)
    # Wall times are floats: each observation's time is exact to one ulp of it.
    tol = 2 * (seen + 1) * 256 * math.ulp(max(t, 1.0))
    assert u.borrowed_core_s == pytest.approx(above, rel=1e-9, abs=tol)
    assert u.lent_core_s == pytest.approx(below, rel=1e-9, abs=tol)
    assert u.borrowed_core_s - u.lent_core_s == pytest.approx(net, rel=1e-9, abs=2 * tol)
    assert (u.start, u.since) == (t0, t)


# --- a cycle's widths --------------------------------------------------------------------------

def view(job_id, alloc, current, *, folder=True, malleable=True, requested=None):
    return JobView(job_id, UID, "u", S(alloc), S(current), has_folder=folder,
                   spec=MalleableSpec(1, None) if malleable else None, requested=requested)


def outcome(job, after, status=OutcomeStatus.APPLIED):
    a = Action(ActionKind.GROW, job.job_id, job.uid, job.allocation, job.current, S(after),
               (len(after),), Reason.LEND_IDLE)
    return Outcome(a, status)


def test_the_width_after_a_cycle_is_the_applied_action_else_what_the_job_held():
    grown, failed, still, folderless = (view(1, {0}, {0}), view(2, {1}, {1}),
                                        view(3, {2, 3}, {2}), view(4, {4}, {4}, folder=False))
    snap = NodeSnapshot("n1", S(range(8)), (grown, failed, still, folderless))
    held = held_after(snap, [outcome(grown, {0, 5, 6}),
                             outcome(failed, {1, 7}, OutcomeStatus.FAILED)])
    assert held == {1: (3, 1), 2: (1, 1), 3: (1, 2)}


def test_a_job_no_longer_seen_is_closed_at_its_last_observation():
    usage = {1: account(None, 3, 1, 10.0), 2: account(None, 1, 2, 10.0)}
    running, gone = account_cycle(usage, {1: (3, 1)}, 20.0)
    assert running[1].borrowed_core_s == 20.0 and set(running) == {1}
    assert gone == {2: usage[2]}              # nothing integrated past what was seen
    line = usage_line(2, "n1", gone[2], end=gone[2].since, closed_by="agent", now=20.0)
    assert line == {"time": 20.0, "event": "job-usage", "job": 2, "node": "n1", "allocation": 2,
                    "borrowed_core_s": 0.0, "lent_core_s": 0.0, "start": 10.0, "end": 10.0,
                    "closed_by": "agent"}


# --- the ledger --------------------------------------------------------------------------------

def test_usage_survives_the_ledger_round_trip():
    led = Ledger(usage={7: CoreUsage(2, 5, 12.5, 3.0, 1.25, 0.5), 8: CoreUsage(1, 1, 1.0, 1.0)})
    assert Ledger.decode(led.encode()) == led
    assert Ledger.decode(Ledger().encode()) == Ledger()
    assert Ledger.decode(b'{"allocations": {}}').usage == {}      # an older agent's ledger


GOOD = {"allocation": 2, "width": 4, "since": 5.0, "start": 1.0, "borrowed": 3.0, "lent": 0.0}


@pytest.mark.parametrize("bad", [
    {**GOOD, "width": -1}, {**GOOD, "width": 1 << 17}, {**GOOD, "width": 2.5},
    {**GOOD, "width": True}, {**GOOD, "allocation": "2"}, {**GOOD, "since": float("nan")},
    {**GOOD, "borrowed": float("inf")}, {**GOOD, "lent": -1.0}, {**GOOD, "start": 10 ** 400},
    {k: v for k, v in GOOD.items() if k != "lent"}, [1, 2], "x", None,
])
def test_bad_usage_is_refused_with_a_protocol_error(bad, tmp_path):
    raw = json.dumps({"usage": {"7": bad}}).encode()
    with pytest.raises(ProtocolError):
        Ledger.decode(raw)
    lf = LedgerFile(tmp_path, "n1")
    lf.save(Ledger())
    (tmp_path / lf.name).write_bytes(raw)
    with pytest.raises(LedgerCorrupt):        # kept aside, like any bad ledger
        lf.load()
    assert lf.kept_aside.read_bytes() == raw


def test_bad_usage_keys_are_refused():
    for key in ("0", "-3", "x", str(2 ** 32)):
        with pytest.raises(ProtocolError):
            Ledger.decode(json.dumps({"usage": {key: GOOD}}).encode())
    with pytest.raises(ProtocolError):
        Ledger.decode(b'{"usage": [1]}')


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4))


@settings(derandomize=True, database=None, deadline=None, max_examples=300)
@given(usage=st.dictionaries(st.text(max_size=4), st.one_of(
    json_leaf, st.dictionaries(st.sampled_from(sorted(GOOD) + ["x"]), json_leaf, max_size=7))))
def test_any_usage_decodes_or_is_refused_with_a_protocol_error(usage):
    raw = json.dumps({"usage": usage}).encode()
    try:
        led = Ledger.decode(raw)
    except ProtocolError:
        return
    for u in led.usage.values():
        assert 0 <= u.width <= 1 << 16 and math.isfinite(u.borrowed_core_s + u.lent_core_s)


# --- the reconciler's cycles and the Epilog ----------------------------------------------------

class Node:
    """A node's cpusets: the fake observer reads them, the fake executor writes them, and each
    write is kept with its time (the truth the accounting is checked against)."""
    refusal = None      # the node's CPU numbering is never in question here
    numbering = None    # Slurm's CPU ids are Linux's
    site_switched_off = None   # the site never switched malleability off here
    feed_malleable = True      # its feed lists a malleable job (the node is never quiet)

    def __init__(self, clock):
        self.clock = clock
        self.alloc: dict[int, frozenset[int]] = {}
        self.current: dict[int, frozenset[int]] = {}
        self.writes: dict[int, list[tuple[float, int]]] = {}
        self.requested: dict[int, int] = {}      # the owner's cpus=K

    def start(self, job_id, cpus):
        self.alloc[job_id] = self.current[job_id] = S(cpus)
        self.writes[job_id] = [(self.clock(), len(cpus))]

    def observe(self, ledger):
        jobs = tuple(view(j, self.alloc[j], self.current[j], requested=self.requested.get(j))
                     for j in sorted(self.current) if j not in ledger.ended)
        return NodeSnapshot("n1", S(range(8)), jobs)

    def execute(self, plan, snapshot):
        for a in plan.actions:
            if a.after != self.current[a.job_id]:
                self.current[a.job_id] = a.after
                self.writes[a.job_id].append((self.clock(), len(a.after)))
        return [Outcome(a, OutcomeStatus.APPLIED) for a in plan.actions]

    def end(self, job_id):
        del self.current[job_id]
        self.writes[job_id].append((self.clock(), None))

    def truth(self, job_id):
        """(borrowed, lent) of the job's write timeline, summed directly."""
        alloc, w = len(self.alloc[job_id]), self.writes[job_id]
        steps = [(t1 - t0, width) for (t0, width), (t1, _) in zip(w, w[1:])]
        above, below, _ = direct_integral(w[0][0], steps, alloc)
        return above, below


class Clock:
    def __init__(self, t=1_700_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def agent(tmp_path):
    config = AgentConfig.under(tmp_path, node="n1")
    prepare_node_folders(config)
    clock = Clock()
    node = Node(clock)
    ledger = LedgerFile(config.state_dir, "n1")
    rec = Reconciler(config, node, node, ledger, FeedStore(config.feed_dir), wall=clock)
    return config, clock, node, ledger, rec


def events(config):
    return [json.loads(line) for line in config.event_log.read_text().splitlines()]


def epilog(config, clock, node, job_id):
    """What hooks.epilog does under the lock, at the clock's time."""
    lf = LedgerFile(config.state_dir, "n1")
    led = lf.load()
    led.ended[job_id] = clock()
    line = close_job(led, job_id, "n1", led.ended[job_id], config.event_log)
    lf.save(led)
    node.end(job_id)
    return line


def test_cycles_and_the_epilog_account_each_job_within_2_percent_of_its_cpuset(agent):
    """Lend-idle on an 8-core node: A and B grow into the idle cores, C starts and takes its
    cores back, C's owner asks for 2 of its 4 cores (it lends 2), B ends and A grows again,
    C's owner asks for all 4 again, C and A end. Each job's job-usage line matches the integral
    of its cpuset width minus its allocation (above: borrowed; below: lent)."""
    import random
    config, clock, node, ledger, rec = agent
    rng = random.Random(7)

    def run(seconds):
        end = clock.t + seconds
        while clock.t < end:
            clock.t += rng.uniform(0.2, 0.8)        # cycles at uneven times
            result = rec.cycle()
            assert not result.failures, result.failures

    node.start(1, {0, 1})
    node.start(2, {2, 3})
    run(30)
    assert len(node.current[1]) > 2 and ledger.load().usage[1].borrowed_core_s > 0
    node.start(3, {4, 5, 6, 7})
    run(20)
    node.requested[3] = 2
    run(15)
    assert epilog(config, clock, node, 2)["closed_by"] == "epilog"
    run(40)
    del node.requested[3]
    run(10)
    epilog(config, clock, node, 3)
    run(10)
    epilog(config, clock, node, 1)
    run(5)
    lines = {e["job"]: e for e in events(config) if e["event"] == "job-usage"}
    assert set(lines) == {1, 2, 3}
    truth = {job_id: node.truth(job_id) for job_id in lines}
    assert truth[1][0] > 0 and truth[2][0] > 0 and truth[3][1] > 0    # each case happened
    for job_id, (above, below) in truth.items():
        e = lines[job_id]
        assert e["borrowed_core_s"] == pytest.approx(above, rel=0.02, abs=0.01)
        assert e["lent_core_s"] == pytest.approx(below, rel=0.02, abs=0.01)
        # Seen first by the cycle after its folder was made (at its allocation: nothing lent).
        assert 0 < e["start"] - node.writes[job_id][0][0] < 1
        assert (e["end"], e["allocation"]) == (node.writes[job_id][-1][0],
                                               len(node.alloc[job_id]))
    assert ledger.load().usage == {}                # bounded: ended jobs leave the ledger
    node.start(4, {0})
    assert rec.cycle().usage.keys() == {4}


def test_a_job_gone_without_its_epilog_is_closed_by_the_agent_once(agent):
    config, clock, node, ledger, rec = agent
    node.start(1, {0, 1})
    rec.cycle()
    clock.t += 10
    rec.cycle()
    borrowed = ledger.load().usage[1].borrowed_core_s
    assert borrowed == pytest.approx(60.0)          # 8 cores, 2 of them its own, for 10 s
    node.end(1)                                     # its folder went, no Epilog ran
    clock.t += 100
    rec.cycle()
    clock.t += 1
    rec.cycle()
    (line,) = [e for e in events(config) if e["event"] == "job-usage"]
    assert (line["borrowed_core_s"], line["closed_by"], line["end"]) == \
        (borrowed, "agent", clock.t - 101)          # nothing past its last observation
    assert ledger.load().usage == {}


def test_the_epilog_closes_the_usage_and_writes_one_line(tmp_path, monkeypatch):
    config = AgentConfig.under(tmp_path, node="n1")
    prepare_node_folders(config)
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_JOB_UID", str(UID))
    lf = LedgerFile(config.state_dir, "n1")
    t0 = time.time() - 10
    lf.save(Ledger(usage={41: CoreUsage(2, 4, t0, t0 - 5, borrowed_core_s=7.0),
                          42: CoreUsage(1, 1, t0, t0)}))
    assert hooks.epilog(config) == 0
    led = lf.load()
    assert 41 in led.ended and set(led.usage) == {42}
    (line,) = events(config)
    assert (line["event"], line["job"], line["node"], line["allocation"], line["start"],
            line["closed_by"]) == ("job-usage", 41, "n1", 2, t0 - 5, "epilog")
    assert line["end"] == led.ended[41]
    assert line["borrowed_core_s"] == pytest.approx(7.0 + 2 * (line["end"] - t0), abs=0.01)
    assert line["lent_core_s"] == 0.0
    monkeypatch.setenv("SLURM_JOB_ID", "43")           # never seen here: no line
    assert hooks.epilog(config) == 0
    assert len(events(config)) == 1


def test_an_unwritable_event_log_never_keeps_the_epilog_from_ending_the_job(tmp_path, capsys):
    led = Ledger(usage={5: CoreUsage(1, 2, 0.0, 0.0)})
    line = close_job(led, 5, "n1", 10.0, tmp_path / "no" / "such" / "events.jsonl")
    assert line["borrowed_core_s"] == 10.0 and led.usage == {}
    assert '"job-usage"' in capsys.readouterr().err


def test_record_cycle_saves_the_ledger(tmp_path):
    lf = LedgerFile(tmp_path, "n1")
    led = Ledger(usage={9: CoreUsage(1, 1, 0.0, 0.0)})
    job = view(5, {0}, {0})
    snap = NodeSnapshot("n1", S(range(4)), (job,))
    lines = []
    usage = record_cycle(lf, led, CycleResult(snapshot=snap, outcomes=[outcome(job, {0, 1})]),
                         3.0, lines.append)
    assert usage == lf.load().usage == {5: CoreUsage(1, 2, 3.0, 3.0)}
    assert [(e["job"], e["closed_by"]) for e in lines] == [(9, "agent")]


def test_a_job_the_agent_closes_is_handed_to_the_watcher_too(tmp_path):
    """Its folder went before its Epilog ran (scancel): the Epilog then finds nothing to close,
    so the agent's line is the job's only one, and the watcher must get it (it once stayed in
    the node's event log)."""
    from slurm_plugin.node.accounting import hand_to_watcher
    lf = LedgerFile(tmp_path, "n1")
    led = Ledger(usage={9: CoreUsage(1, 2, 0.0, 0.0, 5.0, 0.0)})
    snap = NodeSnapshot("n1", S(range(4)), ())
    store = FeedStore(tmp_path / "feed")
    record_cycle(lf, led, CycleResult(snapshot=snap, outcomes=[]), 3.0, lambda e: None,
                 lambda job_id, line: hand_to_watcher(store.feed_dir, job_id, line))
    assert store.usage_files() == {9: ["9.n1.json"]}
    line = json.loads(store.read_usage("9.n1.json"))
    assert (line["job"], line["borrowed_core_s"], line["closed_by"]) == (9, 5.0, "agent")


# --- malleable status and the metrics -----------------------------------------------------------

def test_status_shows_each_jobs_core_seconds_so_far_to_root_only(tmp_path):
    from slurm_plugin.commands.status import collect_status, format_table
    store = FeedStore(tmp_path / "feed")
    store.prepare()
    store.write_node(NodeFeed("n1", 4, (
        FeedJob(1, 1000, "alice", S({0}), ("n1",), MalleableSpec(1, None)),
        FeedJob(2, 1001, "bob", S({1, 2}), ("n1",), MalleableSpec(1, None)))))
    state = tmp_path / "agent"
    LedgerFile(state, "n1").save(Ledger(usage={1: CoreUsage(1, 3, 100.0, 50.0, 10.0, 0.0)}))
    rows = collect_status(store, state_dir=state, now=110.0)
    assert [(r.job_id, r.borrowed_core_s, r.lent_core_s) for r in rows] == \
        [(1, 30.0, 0.0), (2, None, None)]
    table = format_table(rows)
    assert "BORROWED" in table.splitlines()[0] and "LENT" in table.splitlines()[0]
    assert [line.split()[7:9] for line in table.splitlines()[1:]] == [["30", "0"], ["-", "-"]]
    mine = collect_status(store, state_dir=state, uid=1000, now=110.0)
    assert [(r.job_id, r.borrowed_core_s) for r in mine] == [(1, None)]   # the ledger: root's
    assert collect_status(store, state_dir=tmp_path / "none")[0].borrowed_core_s is None
    assert rows[0].to_dict()["borrowed_core_s"] == 30.0


def test_the_metrics_count_node_totals_and_show_running_jobs():
    m = AgentMetrics("n1", per_job=True)
    snap = NodeSnapshot("n1", S(range(4)), ())
    get = m.registry.get_sample_value
    from malleable_policy.model import Plan, Policy
    plan = Plan("n1", Policy.LEND_IDLE, {}, {}, ())

    def observe(usage):
        m.observe(CycleResult(snapshot=snap, plan=plan, usage=usage))

    observe({7: CoreUsage(1, 2, 0.0, 0.0, 100.0, 5.0)})   # first seen: history not counted
    assert get("malleable_borrowed_core_seconds_total", {"node": "n1"}) == 0
    assert get("malleable_job_borrowed_core_seconds", {"node": "n1", "job": "7"}) == 100.0
    observe({7: CoreUsage(1, 2, 0.0, 0.0, 130.0, 5.0), 8: CoreUsage(2, 1, 0.0, 0.0, 0.0, 0.0)})
    observe(None)                                          # a failed cycle changes nothing
    observe({8: CoreUsage(2, 1, 0.0, 0.0, 0.0, 4.0)})      # 7 ended
    assert get("malleable_borrowed_core_seconds_total", {"node": "n1"}) == 30.0
    assert get("malleable_lent_core_seconds_total", {"node": "n1"}) == 4.0
    assert get("malleable_job_borrowed_core_seconds", {"node": "n1", "job": "7"}) is None
    assert get("malleable_job_lent_core_seconds", {"node": "n1", "job": "8"}) == 4.0
