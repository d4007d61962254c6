"""A job's borrowed and lent cores from its nodes' Epilogs to Slurm's accounting: the pure
parts (usage.py), the feed's usage files, and the watcher closing them with a settable fake
database (the real one, slurmdbd on MariaDB, is in tests/integration/test_step_growth.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from slurm_plugin.feed import ClusterWatcher, FeedStore, WatcherConfig
from slurm_plugin.feed.usage import (JobUsage, NodeUsage, UsageError, jobs_to_close,
                                     parse_usage_file_name, system_comment, usage_file_name)
from slurm_plugin.slurm import Job, JobState, SlurmClientError
from malleable_protocol.runner import CommandError
from slurm_plugin.slurm.parsers import parse_config_value, parse_sacct_comments

FIX = Path(__file__).resolve().parents[2] / "fixtures"


def line(job=7, node="n1", borrowed=4.1, lent=0.0, allocation=1, end=110.0) -> dict:
    """What the Epilog writes (slurm_plugin.node.accounting.usage_line)."""
    return {"time": end, "event": "job-usage", "job": job, "node": node,
            "allocation": allocation, "borrowed_core_s": borrowed, "lent_core_s": lent,
            "start": 100.0, "end": end, "closed_by": "epilog"}


def raw(**kw) -> bytes:
    return json.dumps(line(**kw)).encode()


def test_a_node_usage_is_read_from_the_epilogs_line():
    u = NodeUsage.decode(raw(borrowed=4.1, lent=0.5))
    assert (u.job_id, u.node, u.allocation, u.borrowed_core_s, u.lent_core_s, u.end) == \
        (7, "n1", 1, 4.1, 0.5, 110.0)


@pytest.mark.parametrize("change", [
    {"event": "job-start"}, {"job": 0}, {"job": -3}, {"job": True}, {"job": 2**32},
    {"node": "../x"}, {"node": ""}, {"borrowed_core_s": -1.0}, {"borrowed_core_s": "1"},
    {"lent_core_s": float("nan")}, {"end": 1e300}, {"allocation": 1 << 20},
])
def test_a_bad_usage_line_is_refused(change):
    d = {**line(), **change}
    with pytest.raises(UsageError):
        NodeUsage.decode(json.dumps(d).encode())


def test_a_huge_or_deep_usage_file_is_refused_before_parsing():
    with pytest.raises(UsageError, match="bytes"):
        NodeUsage.decode(b" " * 5000)
    with pytest.raises(UsageError):
        NodeUsage.decode(b"[" * 3000 + b"]" * 3000)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600) | st.text(max_size=300).map(str.encode))
def test_usage_decode_refuses_with_a_usage_error_only(data):
    try:
        NodeUsage.decode(data)
    except UsageError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(list(line())),
                       st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                       max_size=12))
def test_usage_decode_of_any_map_refuses_with_a_usage_error_only(d):
    try:
        u = NodeUsage.decode(json.dumps({**line(), **d}).encode())
    except UsageError:
        return
    assert u.borrowed_core_s >= 0 and u.lent_core_s >= 0 and u.job_id >= 1


def test_a_jobs_usage_is_the_sum_over_its_nodes():
    u = JobUsage.of(7, [NodeUsage.decode(raw(node="n2", borrowed=1.25, lent=0.5, end=120.0)),
                        NodeUsage.decode(raw(node="n1", borrowed=4.1))])
    assert u.borrowed_core_s == pytest.approx(5.35) and u.lent_core_s == 0.5
    d = u.to_json(sacct=True)
    assert d["nodes"]["n1"]["borrowed_core_s"] == 4.1 and d["end"] == 120.0 and d["sacct"]
    assert u.sacct_text() == "malleable:borrowed_core_s=5.350,lent_core_s=0.500,nodes=2"


@pytest.mark.parametrize("nodes", [[], [line(job=8)], [line(), line()]])
def test_a_jobs_usage_refuses_no_node_another_job_or_a_node_twice(nodes):
    with pytest.raises(UsageError):
        JobUsage.of(7, [NodeUsage.decode(json.dumps(n).encode()) for n in nodes])


def usage(borrowed=1.0):
    return JobUsage.of(7, [NodeUsage.decode(raw(borrowed=borrowed))])


@pytest.mark.parametrize("old, new", [
    (None, "malleable:borrowed_core_s=1.000,lent_core_s=0.000,nodes=1"),
    ("", "malleable:borrowed_core_s=1.000,lent_core_s=0.000,nodes=1"),
    # an earlier write of ours is replaced, slurmctld's own words kept
    ("launch failed requeued held malleable:borrowed_core_s=9.000,lent_core_s=0.000,nodes=1",
     "launch failed requeued held malleable:borrowed_core_s=1.000,lent_core_s=0.000,nodes=1"),
])
def test_the_system_comment_keeps_what_was_there_and_replaces_ours(old, new):
    assert system_comment(old, usage()) == new


@pytest.mark.parametrize("old", ["it's", 'a "b"', "back\\slash", "Upper", "tab\there",
                                 "x" * 1000])
def test_a_system_comment_sacctmgr_cannot_keep_is_left_alone(old):
    with pytest.raises(UsageError):
        system_comment(old, usage())


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_a_system_comment_written_is_always_safe_for_sacctmgr(old):
    try:
        text = system_comment(old, usage())
    except UsageError:
        return
    assert text == text.lower() and not set(text) & set("'\"\\`") and text.isprintable()
    assert text.endswith(usage().sacct_text()) and text.count("malleable:") == 1


@pytest.mark.parametrize("name, parsed", [
    ("7.n1.json", (7, "n1")), ("12.node-3.rack.json", (12, "node-3.rack")),
    (".7.n1.json.tmp", None), ("7.n1.json.tmp", None), ("x.n1.json", None), ("0.n1.json", None),
    ("7..json", None), ("7.n1", None), ("²7.n1.json", None), ("99999999999.n1.json", None),
    ("7.a/b.json", None), ("7.....json", None),
])
def test_usage_file_names(name, parsed):
    assert parse_usage_file_name(name) == parsed


@given(st.text(max_size=40))
def test_usage_file_names_never_raise(name):
    parsed = parse_usage_file_name(name)
    if parsed is not None:
        assert usage_file_name(*parsed) == name


def job(job_id, state):
    return Job(job_id=job_id, name="j", user="u", uid=1000, state=JobState(state),
               partition="debug", nodes=("n1",), num_cpus=1)


def test_a_jobs_usage_is_closed_once_slurm_holds_its_cores_nowhere():
    jobs = [job(1, "RUNNING"), job(2, "COMPLETING"), job(3, "COMPLETED"), job(4, "FAILED")]
    # 5: gone from slurmctld's list (ended before MinJobAge)
    assert jobs_to_close([1, 2, 3, 4, 5], jobs) == [3, 4, 5]


# --- real command output -----------------------------------------------------------------

def test_accounting_storage_is_read_from_scontrol_show_config():
    text = (FIX / "slurm-22.05" / "scontrol_show_config_slurmdbd.txt").read_text()
    assert parse_config_value(text, "AccountingStorageType") == "accounting_storage/slurmdbd"
    assert parse_config_value(text, "AccountingStoragePort") == "36915"
    assert parse_config_value(text, "NoSuchKey") is None


def test_sacct_comments_of_jobs_with_none_one_or_two_records():
    # As sacct -X -n -P -o JobIDRaw,SystemComment prints them: no record, an empty comment,
    # a comment; a requeued job has a record per run (the latest last); an administrator's
    # comment with a line break in it continues on the next line.
    assert parse_sacct_comments("") == {}
    assert parse_sacct_comments("7|\n") == {7: ""}
    assert parse_sacct_comments("7|malleable:x\n8|a|b\n") == {7: "malleable:x", 8: "a|b"}
    assert parse_sacct_comments("7|first\n7|second\n") == {7: "second"}
    assert parse_sacct_comments("7|two\nlines\n8|\n") == {7: "two\nlines", 8: ""}
    assert parse_sacct_comments("junk\n\u0661|x\n") == {}


# --- the feed's files and the watcher ----------------------------------------------------

class FakeAccounting:
    """Slurm's database: a SystemComment per job id it knows; ``calls`` counts the commands
    (sacct, sacctmgr) the watcher ran."""

    def __init__(self, known=(), fail=False, refuse=()):
        self.comments = {j: "" for j in known}
        self.fail = fail
        self.refuse = set(refuse)          # jobs sacctmgr does not modify (it goes on past them)
        self.calls: list[str] = []

    def system_comments(self, job_ids):
        self.calls.append("sacct")
        if self.fail:
            raise SlurmClientError("slurmdbd down")
        return {j: self.comments[j] for j in job_ids if j in self.comments}

    def set_system_comments(self, texts):
        self.calls.append("sacctmgr")
        for job_id, text in texts.items():
            if job_id not in self.refuse:
                self.comments[job_id] = text
        if self.refuse & set(texts):
            raise CommandError(["sacctmgr"], 1, " Nothing modified")


class Jobs:
    def __init__(self, jobs):
        self.jobs_ = jobs

    def nodes(self):
        return []

    def jobs(self, layout=None, **kw):
        return self.jobs_


def watcher(tmp_path, jobs, accounting, wall=1000.0, **config):
    store = FeedStore(tmp_path)
    store.prepare()
    return store, ClusterWatcher(WatcherConfig(feed_dir=tmp_path, **config), Jobs(jobs), store,
                                 accounting=accounting, wall=lambda: wall)


def test_the_watcher_writes_an_ended_jobs_usage_into_the_database_once(tmp_path):
    db = FakeAccounting(known=[7, 8])
    store, w = watcher(tmp_path, [job(7, "COMPLETED"), job(8, "COMPLETING")], db)
    store.write_usage(7, "n1", raw(node="n1", borrowed=1.5))
    store.write_usage(7, "n2", raw(node="n2", borrowed=0.0, lent=2.0))
    store.write_usage(8, "n1", raw(job=8))
    result = w.poll()
    assert result.error is None and result.usage_closed == [7]
    assert db.comments == {7: "malleable:borrowed_core_s=1.500,lent_core_s=2.000,nodes=2",
                           8: ""}
    (logged,) = [json.loads(s) for s in store.usage_log.read_text().splitlines()]
    assert logged["job"] == 7 and logged["sacct"] is True and set(logged["nodes"]) == {"n1", "n2"}
    assert list(store.usage_files()) == [8]             # 8 still COMPLETING: its files wait
    assert w.poll().usage_closed == []


def test_without_a_database_the_usage_goes_to_the_log_only(tmp_path):
    store, w = watcher(tmp_path, [], None)
    store.write_usage(7, "n1", raw())
    assert w.poll().usage_closed == [7]
    assert json.loads(store.usage_log.read_text())["sacct"] is False
    assert store.usage_files() == {}


def test_a_job_the_database_does_not_know_yet_waits_then_is_logged_without_it(tmp_path):
    db = FakeAccounting(known=[])
    store, w = watcher(tmp_path, [], db, wall=200.0, usage_retry_s=3600.0)
    store.write_usage(7, "n1", raw(end=110.0))
    assert w.poll().usage_closed == [] and list(store.usage_files()) == [7]
    db.fail = True
    assert w.poll().usage_closed == [] and list(store.usage_files()) == [7]
    w._wall = lambda: 110.0 + 3600.0
    assert w.poll().usage_closed == [7]
    assert json.loads(store.usage_log.read_text())["sacct"] is False and db.comments == {}


def test_a_bad_or_swapped_usage_file_is_dropped_and_nothing_else_changes(tmp_path):
    db = FakeAccounting(known=[7, 9])
    store, w = watcher(tmp_path, [], db)
    store.write_usage(7, "n1", raw())
    store.write_usage(7, "n2", b"{not json")
    target = tmp_path / "secret"
    target.write_text(json.dumps(line(job=9)))
    os.symlink(target, store.usage_dir / "9.n1.json")       # a link: never followed
    assert w.poll().usage_closed == [7, 9]
    assert db.comments[7] == "malleable:borrowed_core_s=4.100,lent_core_s=0.000,nodes=1"
    assert db.comments[9] == "" and target.exists()
    assert store.usage_files() == {}
    os.symlink(target, store.usage_dir / "10.n1.json")
    with pytest.raises(OSError):                             # ELOOP: O_NOFOLLOW
        store.read_usage("10.n1.json")


def test_a_poll_closes_a_bounded_number_of_jobs(tmp_path):
    db = FakeAccounting(known=range(1, 41))
    store, w = watcher(tmp_path, [], db, usage_jobs_per_poll=16)
    for j in range(1, 41):
        store.write_usage(j, "n1", raw(job=j))
    assert len(w.poll().usage_closed) == 16
    assert len(w.poll().usage_closed) == 16
    assert len(w.poll().usage_closed) == 8 and store.usage_files() == {}


def test_usage_file_names_from_the_store_are_checked(tmp_path):
    store = FeedStore(tmp_path)
    store.prepare()
    for bad in ("../x.json", "7.n1.json.tmp", "x"):
        with pytest.raises(ValueError):
            store.read_usage(bad)
        with pytest.raises(ValueError):
            store.remove_usage(bad)
    with pytest.raises(ValueError):
        store.write_usage(7, "../n1", raw())


def test_a_job_that_neither_borrowed_nor_lent_costs_the_database_nothing(tmp_path):
    """Issue 40: every job, rigid ones included, had a sacct and a sacctmgr round trip at its
    end. One with nothing borrowed or lent on any node is logged only."""
    db = FakeAccounting(known=[7, 8])
    store, w = watcher(tmp_path, [job(7, "COMPLETED"), job(8, "COMPLETED")], db)
    store.write_usage(7, "n1", raw(node="n1", borrowed=0.0, lent=0.0))
    store.write_usage(8, "n1", raw(job=8, node="n1", borrowed=0.5))
    assert sorted(w.poll().usage_closed) == [7, 8]
    assert db.comments[7] == "" and db.comments[8]
    logged = {json.loads(s)["job"]: json.loads(s) for s in store.usage_log.read_text().splitlines()}
    assert logged[7]["sacct"] is False and logged[8]["sacct"] is True
    db.calls.clear()
    for j in range(20, 60):                                  # a job array of rigid jobs
        store.write_usage(j, "n1", raw(job=j, node="n1", borrowed=0.0, lent=0.0))
    assert len(w.poll().usage_closed) == 40 and db.calls == []


def test_a_polls_jobs_cost_the_database_three_calls_whatever_their_number(tmp_path):
    """Issue 41: the jobs that borrowed or lent are read, written and read back together."""
    db = FakeAccounting(known=range(1, 51))
    store, w = watcher(tmp_path, [], db)
    for j in range(1, 51):
        store.write_usage(j, "n1", raw(job=j, node="n1", borrowed=float(j)))
    assert len(w.poll().usage_closed) == 50
    assert db.calls == ["sacct", "sacctmgr", "sacct"]
    assert db.comments[50] == "malleable:borrowed_core_s=50.000,lent_core_s=0.000,nodes=1"


def test_a_job_sacctmgr_did_not_modify_waits_and_the_others_are_closed(tmp_path):
    db = FakeAccounting(known=[7, 8, 9], refuse=[8])
    store, w = watcher(tmp_path, [], db, wall=200.0, usage_retry_s=3600.0)
    for j in (7, 8, 9):
        store.write_usage(j, "n1", raw(job=j, node="n1", borrowed=1.0, end=150.0))
    assert sorted(w.poll().usage_closed) == [7, 9]
    assert list(store.usage_files()) == [8] and db.comments[8] == ""
    db.refuse.clear()
    assert w.poll().usage_closed == [8] and db.comments[8]


class HungAccounting(FakeAccounting):
    """A slurmdbd that does not answer until ``answer`` is set: each call waits for it."""

    def __init__(self, **kw):
        super().__init__(**kw)
        import threading
        self.answer, self.asked = threading.Event(), threading.Event()
        self.asks = 0

    def system_comments(self, job_ids):
        self.asks += 1
        self.asked.set()
        assert self.answer.wait(30), "the test never let the database answer"
        return super().system_comments(job_ids)


def test_a_hung_database_never_holds_the_feed_back(tmp_path):
    """The watcher's command closes usage in a thread of its own (usage_runner.py): while
    slurmdbd does not answer, polls go on publishing feeds, a second closing is not started
    beside the first, and the job's usage is closed once the database answers."""
    from slurm_plugin.feed.usage_runner import BackgroundUsage
    db = HungAccounting(known=[7])
    store = FeedStore(tmp_path)
    store.prepare()
    usage = BackgroundUsage()
    jobs = Jobs([job(7, "COMPLETED")])
    walls = iter(range(1000, 2000, 10))
    w = ClusterWatcher(WatcherConfig(feed_dir=tmp_path), jobs, store, accounting=db,
                       wall=lambda: float(next(walls)), usage=usage)
    store.write_usage(7, "n1", raw(borrowed=1.5))
    first = w.poll()
    assert db.asked.wait(30)                      # the closing is in the database's hands
    assert first.error is None and first.usage_closed == []
    published = store.polled_at()
    second = w.poll()                             # returns though the database still hangs
    assert second.error is None and second.usage_closed == []
    assert store.polled_at() > published          # this poll was published
    assert db.asks == 1 and not usage.idle.is_set()     # one closing at a time, still waiting
    db.answer.set()
    assert usage.idle.wait(30)
    assert db.comments[7] == "malleable:borrowed_core_s=1.500,lent_core_s=0.000,nodes=1"
    assert w.poll().usage_closed == [7]           # reported by the poll after it
    assert list(store.usage_files()) == []


def test_a_watcher_that_stands_down_while_closing_leaves_the_usage_to_the_active_one(tmp_path):
    """Control moves to a backup while the database calls run: this watcher logs nothing and
    keeps the files; the one now active closes them, so usage.jsonl has the job once."""
    from slurm_plugin.feed.leader import Role

    class MovingControl(FakeAccounting):
        def set_system_comments(self, texts):
            super().set_system_comments(texts)
            role[0] = Role.STANDBY           # slurmctld's control moved meanwhile

    role = [Role.ACTIVE]
    db = MovingControl(known=[7])
    store, w = watcher(tmp_path, [], db)
    w.role_of = lambda: (role[0], "test")
    store.write_usage(7, "n1", raw())
    assert w.close_usage([]) == []
    assert not store.usage_log.exists() or store.usage_log.read_text() == ""
    assert list(store.usage_files()) == [7]
    # The backup, now active, on the same store: the same comment again, one line.
    backup = ClusterWatcher(WatcherConfig(feed_dir=tmp_path), Jobs([]), store, accounting=db,
                            wall=lambda: 1000.0)
    assert backup.close_usage([]) == [7]
    assert len(store.usage_log.read_text().splitlines()) == 1
    assert db.comments[7] == "malleable:borrowed_core_s=4.100,lent_core_s=0.000,nodes=1"
