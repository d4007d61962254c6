"""Observing a node without slurmctld (feed, cgroups, ledger), and the watcher's feed."""
import json
from pathlib import Path

from malleable_policy.decide import decide
from malleable_policy.model import Policy
from malleable_protocol import ProtocolError, RunLayout
from slurm_plugin.topology import CpuNumbering, SlurmLayout
from slurm_plugin.cgroups import CgroupVersion, SlurmCgroupLayout
import pytest

from slurm_plugin.node.cgroup_actuator import CgroupJob

from slurm_plugin.node.ledger import Ledger, LedgerCorrupt, LedgerFile
from slurm_plugin.node.observe import NodeObserver
from malleable_policy.request import MalleableSpec
from slurm_plugin.feed import ClusterWatcher, FeedJob, FeedStore, NodeFeed, Offers, WatcherConfig
from slurm_plugin.feed.watcher import build_feeds
from slurm_plugin.slurm.parsers import parse_nodes_json, parse_squeue_json

from ..fakes import FakeCgroups, FakeFeed

FIX = Path(__file__).parents[2] / "fixtures" / "slurm-22.05"
S = frozenset


def observer(feed, jobs):
    return NodeObserver("n1", RunLayout(Path("/nonexistent")), feed, FakeCgroups(jobs),
                        read_ranks=lambda *a: (), wall=lambda: 1000.0)


def test_first_sight_records_the_allocation_and_the_feed_overrides_it():
    ledger = Ledger()
    cg = {7: CgroupJob(1000, 7, S({0}), {"step_0": S({0})})}
    snap = observer(FakeFeed(), cg).observe(ledger)
    assert snap.job(7).allocation == {0} and not snap.job(7).malleable
    assert ledger.allocations[7].cpus == {0}
    # Grown later: the ledger, not the folder, says what Slurm gave.
    cg = {7: CgroupJob(1000, 7, S({0, 1}), {"step_0": S({0, 1})})}
    assert observer(FakeFeed(), cg).observe(ledger).job(7).allocation == {0}
    feed = NodeFeed("n1", 4, (FeedJob(7, 1000, "u", S({0}), ("n1",), MalleableSpec(1, None)),))
    snap = observer(FakeFeed(feed), cg).observe(ledger)
    assert snap.job(7).malleable and snap.cpus == S(range(4))


def test_a_starting_job_is_pending_until_its_cores_are_known():
    ledger = Ledger(starting={9: 999.0})
    snap = observer(FakeFeed(), {}).observe(ledger)
    assert snap.pending_starts == (9,)
    # Its folder appears: known, no longer pending.
    snap = observer(FakeFeed(), {9: CgroupJob(1000, 9, S({3}), {})}).observe(ledger)
    assert snap.pending_starts == () and ledger.allocations[9].cpus == {3}
    # Or the feed shows its cores first: reserved, not pending.
    ledger = Ledger(starting={9: 999.0})
    feed = NodeFeed("n1", 4, (FeedJob(9, 1000, "u", S({3}), ("n1",)),))
    snap = observer(FakeFeed(feed), {}).observe(ledger)
    assert snap.pending_starts == () and not snap.job(9).has_folder


def test_stale_feed_jobs_on_cores_a_running_job_holds_are_ended_jobs():
    feed = NodeFeed("n1", 4, (FeedJob(5, 1000, "u", S({0, 1}), ("n1",)),))
    snap = observer(FakeFeed(feed), {8: CgroupJob(1000, 8, S({1}), {})}).observe(Ledger())
    assert [j.job_id for j in snap.jobs] == [8]


def test_a_job_whose_epilog_ran_frees_its_cores_before_the_feed_catches_up():
    feed = NodeFeed("n1", 4, (FeedJob(5, 1000, "u", S({2, 3}), ("n1",)),))
    ledger = Ledger(ended={5: 999.0})
    assert observer(FakeFeed(feed), {}).observe(ledger).jobs == ()
    assert 5 in ledger.ended                      # kept while the feed still lists it
    observer(FakeFeed(NodeFeed("n1", 4, ())), {}).observe(ledger)
    assert ledger.ended == {}


def test_peer_cap_is_the_smallest_offer_of_the_other_nodes():
    spec = MalleableSpec(1, None)
    feed = NodeFeed("n1", 4, (FeedJob(5, 1000, "u", S({0}), ("n1", "n2", "n3"), spec),))
    offers = {"n2": Offers("n2", {5: 3}), "n3": Offers("n3", {5: 1})}
    snap = observer(FakeFeed(feed, offers), {5: CgroupJob(1000, 5, S({0}), {})}).observe(Ledger())
    assert snap.job(5).peer_cap_per_rank == 1 and snap.job(5).nodes == 3


def test_ledger_file_round_trip_and_garbage(tmp_path):
    lf = LedgerFile(tmp_path, "n1")
    led = Ledger(starting={3: 1.5})
    led.allocations[2] = __import__("slurm_plugin.node.ledger", fromlist=["x"]).Allocation(
        7, S({1, 2}))
    lf.save(led)
    assert lf.load() == led
    (tmp_path / "ledger-n1.json").write_text("{not json")
    with pytest.raises(LedgerCorrupt, match="kept in"):
        lf.load()
    assert lf.kept_aside.read_text() == "{not json"
    assert not (tmp_path / "ledger-n1.json").exists()
    with pytest.raises(LedgerCorrupt):      # and again, until the admin removes the kept file
        lf.load()
    lf.kept_aside.unlink()
    assert lf.load() == Ledger()


def test_build_feeds_from_captured_squeue_and_sinfo():
    nodes = parse_nodes_json((FIX / "sinfo.json").read_text())
    from slurm_plugin.slurm.client import CliSlurmClient
    jobs = CliSlurmClient()._with_cpu_ids(parse_squeue_json((FIX / "squeue.json").read_text()),
                                          nodes)
    feeds = build_feeds(jobs, nodes, 1.0)
    assert set(feeds) == {n.name for n in nodes}
    running = [j for j in jobs if j.state.holds_cores]
    for j in running:
        for node, cpus in j.cpu_ids.items():
            assert feeds[node].job(j.job_id).allocation == cpus
    assert NodeFeed.decode(feeds[nodes[0].name].encode()) == feeds[nodes[0].name]


class CountingClient:
    def __init__(self):
        self.calls = []
        self.nodes_ = parse_nodes_json((FIX / "sinfo.json").read_text())
        self.jobs_ = parse_squeue_json((FIX / "squeue.json").read_text())

    def nodes(self):
        self.calls.append("sinfo")
        return self.nodes_

    def jobs(self, layout=None, **kw):
        self.calls.append("squeue")
        from slurm_plugin.slurm.client import CliSlurmClient
        return CliSlurmClient()._with_cpu_ids(self.jobs_, layout)


def test_watcher_asks_once_per_poll_and_writes_only_changes(tmp_path):
    client = CountingClient()
    store = FeedStore(tmp_path)
    store.prepare()
    w = ClusterWatcher(WatcherConfig(feed_dir=tmp_path), client, store, wall=lambda: 5.0)
    first = w.poll()
    second = w.poll()
    assert client.calls == ["sinfo", "squeue", "squeue"]      # the layout is cached
    assert first.nodes_written and second.nodes_written == []
    assert store.read_node(first.nodes_written[0]).updated == 5.0
    assert store.polled_at() == 5.0        # every poll's time, changed or not (node.quiet)


def test_watcher_polls_on_events_and_on_resync_only(tmp_path):
    client = CountingClient()
    store = FeedStore(tmp_path)
    now = [0.0]
    ticks = []

    def sleep(dt):
        now[0] += dt
        ticks.append(now[0])
        if len(ticks) == 40:                 # 2 s in: slurmctld's hook appends an event
            with open(store.events_file, "a") as f:
                f.write("1 update 5\n")

    w = ClusterWatcher(WatcherConfig(feed_dir=tmp_path, resync_s=10.0, event_check_s=0.05),
                       client, store, clock=lambda: now[0], sleep=sleep)
    w.run(lambda: now[0] > 25.0)
    # t=0 (start), t~2 (event), t~12 and t~22 (resyncs after the event's poll)
    assert client.calls.count("squeue") == 4, client.calls


def test_a_loop_of_events_makes_the_watcher_poll_at_most_every_min_gap(tmp_path):
    """A user updating his job in a loop appends a line every 50 ms (the hook allows 50 a second):
    the watcher polls slurmctld at most once per event_min_gap_s, and still within that gap of
    the first event."""
    client = CountingClient()
    store = FeedStore(tmp_path)
    now = [0.0]

    def sleep(dt):
        now[0] += dt
        if 1.0 <= now[0] < 3.0:            # 2 s of a line every tick
            with open(store.events_file, "a") as f:
                f.write("1 update 5\n")

    w = ClusterWatcher(WatcherConfig(feed_dir=tmp_path, resync_s=10.0, event_check_s=0.05,
                                     event_min_gap_s=0.25),
                       client, store, clock=lambda: now[0], sleep=sleep)
    w.run(lambda: now[0] > 4.0)
    polls = client.calls.count("squeue")
    # t=0, then events from t=1 to 3: at most 2 s / 0.25 s + 1 polls, and many fewer than
    # the ~28 ticks that saw a new line.
    assert 1 + 4 <= polls <= 1 + 9, client.calls


def test_every_feed_record_survives_its_own_bounds():
    from slurm_plugin.feed import JobReport, NodeReport
    rep = NodeReport("n1", (JobReport(3, S({0, 1}), (2, 1), (4.5, 3.0)),))
    assert NodeReport.decode(rep.encode()) == rep
    off = Offers("n1", {3: 2})
    assert Offers.decode(off.encode()) == off


def test_a_fence_holds_until_the_steps_slurmstepd_joins_its_cpuset():
    from slurm_plugin.node.ledger import Fence
    feed = NodeFeed("n1", 4, (FeedJob(7, 1000, "u", S({0}), ("n1",), MalleableSpec(1, None)),))
    cg = {7: CgroupJob(1000, 7, S({0, 1, 2, 3}), {"step_batch": S({0, 1, 2, 3})})}
    where = {41: "/slurm_n1/uid_1000/job_7/step_batch"}     # slurmstepd not in step_0 yet
    ledger = Ledger(allocations={}, fences={(7, "step_0"): Fence("step_0", 41, 999.0)})

    def obs(now=1000.0):
        return NodeObserver("n1", RunLayout(Path("/nonexistent")), FakeFeed(feed),
                            FakeCgroups(cg), read_ranks=lambda *a: (), wall=lambda: now,
                            cpuset_of=where.get)
    assert obs().observe(ledger).job(7).fenced
    assert not obs().observe(ledger).job(7).resizable
    # Another node's slurmd on the same host: not this node's step.
    where[41] = "/slurm_n2/uid_1000/job_7/step_0"
    assert obs().observe(ledger).job(7).fenced
    where[41] = "/slurm_n1/uid_1000/job_7/step_0"           # joined: every write is done
    assert not obs().observe(ledger).job(7).fenced and not ledger.fences
    # Or once the step's folder holds CPUs (written after the job folder's), joined or not.
    where[41] = "/slurm_n1/uid_1000/job_7/step_batch"
    ledger.fences[(7, "step_0")] = Fence("step_0", 41, 999.0)
    assert obs().observe(ledger).job(7).fenced
    cg[7] = CgroupJob(1000, 7, S({0}), {"step_batch": S({0}), "step_0": S()})   # made, empty
    assert obs().observe(ledger).job(7).fenced
    cg[7] = CgroupJob(1000, 7, S({0}), {"step_batch": S({0}), "step_0": S({0})})
    assert not obs().observe(ledger).job(7).fenced
    # A slurmstepd that is gone (the step failed), or a fence that is too old, lifts too.
    for pid, since, now in ((42, 999.0, 1000.0), (41, 0.0, 1000.0)):
        where[41] = "/slurm_n1/uid_1000/job_7/step_batch"
        ledger.fences[(7, "step_1")] = Fence("step_1", pid, since)
        assert not obs(now).observe(ledger).job(7).fenced


def test_fences_survive_the_ledger_file_and_bad_step_names_are_refused(tmp_path):
    import pytest
    from slurm_plugin.node.ledger import Fence, check_step_name
    ledger = Ledger(fences={(7, "step_0"): Fence("step_0", 41, 5.0),
                            (7, "step_batch"): Fence("step_batch", 40, 4.0)})
    f = LedgerFile(tmp_path, "n1")
    f.save(ledger)
    assert f.load().fences == ledger.fences and f.load().fenced_jobs() == {7}
    for bad in ("../step_0", "step_0/x", "step_", "task_0", "step_12345678901", ""):
        with pytest.raises(ValueError):
            check_step_name(bad)


def test_a_job_whose_folder_is_elsewhere_is_reported_and_its_cores_held():
    """The feed says job 8 runs here; no folder where the layout says, but its slurmstepd is
    in a Slurm folder of another layout (a build other than the one discovered): reported in
    the snapshot (the Prolog refuses then), its allocation held; /proc is read only while
    such a job exists, and at most every placement_check_s."""
    from slurm_plugin.cgroups import StepdProcess
    feed = NodeFeed("n1", 4, (FeedJob(7, 1000, "u", S({0}), ("n1",), MalleableSpec(1, None)),
                              FeedJob(8, 1000, "u", S({1}), ("n1",))))
    cg = {7: CgroupJob(1000, 7, S({0}), {"step_0": S({0})})}
    scans, now = [], [1000.0]

    def stepds():
        scans.append(now[0])
        return [StepdProcess(50, 8, "/slurm/uid_1000/job_8/step_batch")]
    obs = NodeObserver("n1", RunLayout(Path("/nonexistent")), FakeFeed(feed), FakeCgroups(cg),
                       read_ranks=lambda *a: (), wall=lambda: now[0], stepds=stepds)
    snap = obs.observe(Ledger())
    assert len(snap.problems) == 1 and "job 8" in snap.problems[0]
    assert "/slurm/uid_1000/job_8/step_batch" in snap.problems[0]
    assert not snap.job(8).has_folder and snap.job(8).current == S({1})
    assert obs.observe(Ledger()).problems == snap.problems and len(scans) == 1   # cached
    now[0] += 5.0
    obs.observe(Ledger())
    assert len(scans) == 2
    cg[8] = CgroupJob(1000, 8, S({1}), {})           # the folder is where the layout says
    assert obs.observe(Ledger()).problems == () and len(scans) == 2


def test_node_report_carries_problems():
    from slurm_plugin.feed import NodeReport
    rep = NodeReport("n1", (), ("job 8: elsewhere",))
    assert NodeReport.decode(rep.encode()) == rep


def test_on_cgroup_v2_the_owner_comes_from_slurms_feed():
    """v2 job folders are root's and carry no uid_<U>: the feed names the owner, whose rank
    records are the ones read."""
    feed = NodeFeed("n1", 2, (FeedJob(7, 1000, "u", S({0}), ("n1",), MalleableSpec(1, None)),))
    cg = {7: CgroupJob(None, 7, S({0}), {"step_0": S({0}), "step_0/user": S({0})})}
    asked = []
    obs = NodeObserver("n1", RunLayout(Path("/nonexistent")), FakeFeed(feed), FakeCgroups(cg),
                       read_ranks=lambda layout, job, uid, cgl: asked.append(uid) or (),
                       wall=lambda: 1000.0)
    ledger = Ledger()
    assert obs.observe(ledger).job(7).uid == 1000 and asked == [1000]
    assert ledger.allocations[7].uid == 1000


def test_on_cgroup_v2_a_fence_holds_until_the_steps_tasks_have_folders():
    """Slurm 24.11 on v2 makes step_<S> and puts the new slurmstepd in step_<S>/slurm before
    the SPANK plugin runs, and the agent may already have written the job's CPUs there (seen in
    the VMs): neither may lift the fence; the tasks' folders, made after slurmstepd's writes, do."""
    from slurm_plugin.node.ledger import Fence

    class V2Cgroups(FakeCgroups):
        layout = SlurmCgroupLayout.named("n1", CgroupVersion.V2, multiple_slurmd=True)
    feed = NodeFeed("n1", 2, (FeedJob(7, 1000, "u", S({0}), ("n1",), MalleableSpec(1, None)),))
    grown = S({0, 1})
    cg = {7: CgroupJob(None, 7, grown, {"step_batch": grown, "step_batch/user": grown,
                                         "step_batch/user/task_0": grown, "step_0": grown,
                                         "step_0/slurm": grown, "step_0/user": grown})}
    where = {41: "/system.slice/n1_slurmstepd.scope/job_7/step_0/slurm"}
    ledger = Ledger(fences={(7, "step_0"): Fence("step_0", 41, 999.0)})

    def obs():
        return NodeObserver("n1", RunLayout(Path("/nonexistent")), FakeFeed(feed),
                            V2Cgroups(cg), read_ranks=lambda *a: (), wall=lambda: 1000.0,
                            cpuset_of=where.get)
    assert obs().observe(ledger).job(7).fenced
    cg[7].folders["step_0/user/task_0"] = S({0})
    assert not obs().observe(ledger).job(7).fenced and not ledger.fences


# -- Slurm's CPU ids turned into the node's (slurm_plugin/topology.py) -----------------------

# Two sockets of two cores, socket 0 holding Linux CPUs 0 and 2 (firmware that alternates):
# Slurm's abstract 0, 1, 2, 3 are Linux's 0, 2, 1, 3.
ALTERNATING = CpuNumbering(linux_of=(0, 2, 1, 3), layout=SlurmLayout(2, 2, 1),
                           cores=(S({0}), S({2}), S({1}), S({3})))


def mapped_observer(feed, jobs, numbering=ALTERNATING, refusal=None):
    return NodeObserver("n1", RunLayout(Path("/nonexistent")), feed, FakeCgroups(jobs),
                        read_ranks=lambda *a: (), wall=lambda: 1000.0, numbering=numbering,
                        refusal=refusal)


def test_the_feeds_abstract_ids_become_the_nodes_own():
    # Slurm gave job 7 its socket 0 (abstract 0-1): Linux 0 and 2, where slurmstepd put it.
    feed = NodeFeed("n1", 4, (FeedJob(7, 1000, "u", S({0, 1}), ("n1",), MalleableSpec(1, None)),
                              FeedJob(9, 1000, "u", S({2}), ("n1",))),
                    layout=SlurmLayout(2, 2, 1))
    obs = mapped_observer(FakeFeed(feed), {7: CgroupJob(1000, 7, S({0, 2}), {})})
    snap = obs.observe(Ledger())
    assert obs.refusal is None and snap.job(7).fault is None
    assert snap.job(7).allocation == {0, 2}
    assert snap.job(9).allocation == {1} and not snap.job(9).has_folder   # reserved, mapped
    assert snap.cpus == {0, 1, 2, 3}
    plan = decide(snap, Policy.LEND_IDLE)
    assert plan.targets[7] == {0, 2, 3}      # the one free core, never job 9's Linux CPU 1


def test_a_folder_that_disagrees_with_the_mapped_allocation_holds_that_job_where_it_is():
    feed = NodeFeed("n1", 4, (FeedJob(7, 1000, "u", S({0, 1}), ("n1",), MalleableSpec(1, None)),),
                    layout=SlurmLayout(2, 2, 1))
    # slurmstepd wrote 0-1 (Slurm's ids read as Linux's: another numbering than computed).
    snap = mapped_observer(FakeFeed(feed), {7: CgroupJob(1000, 7, S({0, 1}), {})}
                           ).observe(Ledger())
    assert snap.job(7).allocation == {0, 1} and "not Slurm's 0,2" in snap.job(7).fault
    assert decide(snap, Policy.LEND_IDLE).targets.get(7, S({0, 1})) == {0, 1}


@pytest.mark.parametrize("layout, refusal, words", [
    (SlurmLayout(1, 4, 1), None, "slurmd -C"),             # Slurm describes the node otherwise
    (SlurmLayout(2, 2, 1), "offline CPUs", "offline"),     # the node could not be read
])
def test_a_refused_numbering_uses_no_feed_cpu_id_and_the_reconciler_holds_every_job(
        layout, refusal, words):
    feed = NodeFeed("n1", 4, (FeedJob(7, 1000, "u", S({0, 1}), ("n1",), MalleableSpec(1, None)),
                              FeedJob(9, 1000, "u", S({3}), ("n1",))), layout=layout)
    obs = mapped_observer(FakeFeed(feed), {7: CgroupJob(1000, 7, S({0, 2}), {})},
                          refusal=refusal)
    snap = obs.observe(Ledger())
    assert words in obs.refusal
    assert snap.job(7).allocation == {0, 2}          # the folder's, not the feed's
    assert [j.job_id for j in snap.jobs] == [7]      # no reservation by the feed's ids


def test_hyperthreaded_nodes_are_observed_in_linux_ids_core_by_core():
    # One socket of two cores, threads i and i + 2: Slurm's 0-1 (core 0) is Linux 0 and 2.
    ht = CpuNumbering(linux_of=(0, 2, 1, 3), layout=SlurmLayout(1, 2, 2),
                      cores=(S({0, 2}), S({1, 3})))
    feed = NodeFeed("n1", 4, (FeedJob(7, 1000, "u", S({0, 1}), ("n1",), MalleableSpec(1, None)),),
                    layout=SlurmLayout(1, 2, 2))
    obs = mapped_observer(FakeFeed(feed), {7: CgroupJob(1000, 7, S({0, 2}), {})}, numbering=ht)
    snap = obs.observe(Ledger())
    assert obs.refusal is None and snap.job(7).allocation == {0, 2}


def test_a_feed_naming_cpus_the_node_lacks_is_refused_not_raised():
    feed = NodeFeed("n1", 8, (FeedJob(7, 1000, "u", S({6}), ("n1",)),))     # an older watcher
    obs = mapped_observer(FakeFeed(feed), {})
    obs.observe(Ledger())
    assert "which has 4" in obs.refusal


def test_the_feed_carries_slurms_layout_of_the_node():
    feed = NodeFeed("n1", 4, (), layout=SlurmLayout(2, 2, 1))
    assert NodeFeed.decode(feed.encode()) == feed
    assert NodeFeed.decode(NodeFeed("n1", 4, ()).encode()).layout is None
    for bad in ([2, 2], [2, 2, 0], [2, True, 1], "2x2x1"):
        raw = json.dumps({"node": "n1", "cpus": 4, "jobs": [], "layout": bad}).encode()
        with pytest.raises(ProtocolError):
            NodeFeed.decode(raw)


def test_the_sites_switch_reaches_every_nodes_feed_through_the_watcher(tmp_path):
    """``malleable disable --site``: the switch in the feed folder, a line in the event file
    (the watcher polls on it); the next poll puts it into every node's feed, which changes
    (written, so each agent is woken), and an agent's observer reads it. Lifted, the feeds
    change back. A switch file that cannot be read counts as thrown."""
    client = CountingClient()
    store = FeedStore(tmp_path)
    store.prepare()
    w = ClusterWatcher(WatcherConfig(feed_dir=tmp_path), client, store, wall=lambda: 5.0)
    names = w.poll().nodes_written
    events = store.events_stamp()
    store.switch_site_off("maintenance")
    assert store.events_stamp() != events
    assert sorted(w.poll().nodes_written) == sorted(names)
    for name in names:
        feed = store.read_node(name)
        assert feed.switched_off.endswith("by 'malleable disable --site': maintenance")
        assert NodeFeed.decode(feed.encode()) == feed
    obs = NodeObserver(names[0], RunLayout(tmp_path / "run"), store, FakeCgroups({}))
    obs.observe(Ledger())
    assert "maintenance" in obs.site_switched_off
    assert w.poll().nodes_written == []                    # unchanged while thrown
    assert store.switch_site_on() and not store.switch_site_on()
    assert sorted(w.poll().nodes_written) == sorted(names)
    assert store.read_node(names[0]).switched_off is None
    store.site_switch_file.mkdir()                         # unreadable as a file: off
    assert "switched off for the site" in store.site_switched_off()


def test_cores_of_a_folder_no_slurmstepd_tells_yet_are_lent_to_no_one():
    """Slurm 26.05's SLUID-named job folder whose slurmstepd has not joined it yet: its cores
    are some job's. They are not the node's to hand out, and the node reports why."""
    feed = NodeFeed("n1", 4, (FeedJob(7, 1000, "u", S({0}), ("n1",), MalleableSpec(1, None)),))
    cg = {7: CgroupJob(None, 7, S({0}), {"step_0": S({0})})}
    obs = NodeObserver("n1", RunLayout(Path("/nonexistent")), FakeFeed(feed),
                       FakeCgroups(cg, unidentified={"s1M9M8M9BHHT00": S({2, 3})}),
                       read_ranks=lambda *a: (), wall=lambda: 1000.0)
    snap = obs.observe(Ledger())
    assert snap.cpus == {0, 1}
    assert snap.problems == ("job folder s1M9M8M9BHHT00 holds 2-3: no slurmstepd in it says "
                             "which job it is (yet)",)
    plan = decide(snap, Policy.LEND_IDLE)
    assert plan.targets[7] == {0, 1}        # grown into the idle core, not into 2-3
