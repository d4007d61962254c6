"""One active watcher beside backup controllers (feed/leader.py): pure decisions, and the
heartbeat file as slurmctld writes it."""
from __future__ import annotations

import struct
import threading
import time

from slurm_plugin.feed.leader import (Heartbeat, HeartbeatHung, HeartbeatReader, Role,
                                      controller_index, decide_role, parse_heartbeat,
                                      read_heartbeat)
from slurm_plugin.slurm.model import ControllerConfig

TWO = ControllerConfig(controllers=("ctl1", "ctl2"), timeout_s=120.0)


def test_a_host_is_the_controller_its_name_matches_first():
    assert controller_index(("ctl1", "ctl2"), "ctl2.cluster.example") == 1
    assert controller_index(("ctl1", "ctl2"), "ctl1") == 0
    assert controller_index(("ctl1", "ctl2"), "login1") is None


def test_one_controller_is_always_active():
    assert decide_role(ControllerConfig(controllers=("c",)), None, None, 0.0)[0] is Role.ACTIVE


def test_the_heartbeats_writer_is_the_active_one_and_only_it():
    beat = Heartbeat(at=1000.0, index=1)
    roles = [decide_role(TWO, mine, beat, 1010.0)[0] for mine in (0, 1)]
    assert roles == [Role.STANDBY, Role.ACTIVE]
    beat = Heartbeat(at=1000.0, index=0)
    assert [decide_role(TWO, mine, beat, 1010.0)[0] for mine in (0, 1)] == \
        [Role.ACTIVE, Role.STANDBY]


def test_without_a_fresh_heartbeat_the_primary_is_active():
    for beat in (None, Heartbeat(at=0.0, index=1)):         # none, or older than the timeout
        assert [decide_role(TWO, mine, beat, 1000.0)[0] for mine in (0, 1)] == \
            [Role.ACTIVE, Role.STANDBY]
    assert decide_role(TWO, None, Heartbeat(1000.0, 0), 1000.0)[0] is Role.STANDBY


def test_a_heartbeat_that_hangs_stands_the_watcher_by_and_the_loop_goes_on(tmp_path):
    """StateSaveLocation on a hung server: the read waits at most its timeout, a second read
    does not start while the first hangs, and the watcher stands by (another slurmctld may take
    control meanwhile); once the file answers again the heartbeat decides."""
    gate, started = threading.Event(), []

    def read(path):
        started.append(path)
        gate.wait(30)                       # a read blocked in the kernel until the server is back
        return Heartbeat(time.time(), 1)

    reader = HeartbeatReader(tmp_path, timeout_s=0.05, read=read)
    t0 = time.monotonic()
    assert isinstance(reader(), HeartbeatHung) and isinstance(reader(), HeartbeatHung)
    assert time.monotonic() - t0 < 5 and len(started) == 1
    for current in Role:          # unknown who is in control: stand by
        assert decide_role(TWO, 0, HeartbeatHung(), 1000.0, current)[0] is Role.STANDBY
    gate.set()
    beat = reader()
    assert isinstance(beat, Heartbeat) and beat.index == 1
    assert decide_role(TWO, 0, beat, time.time(), Role.ACTIVE)[0] is Role.STANDBY


def test_the_heartbeat_file_is_two_big_endian_numbers(tmp_path):
    (tmp_path / "heartbeat").write_bytes(struct.pack(">QQ", 1795000000, 1))
    assert read_heartbeat(tmp_path) == Heartbeat(1795000000.0, 1)
    assert parse_heartbeat(b"short") is None
    assert read_heartbeat(tmp_path / "missing") is None


def test_a_standby_watcher_never_polls_and_polls_at_once_on_taking_over(tmp_path):
    """The watcher's real run loop on a fake clock: standby until t=130 (no poll, the link
    closed), then active: it polls at once and opens its link."""
    from slurm_plugin.feed import ClusterWatcher, FeedStore, WatcherConfig
    from slurm_plugin.slurm import Node

    now, polls, roles = [100.0], [], []

    class Client:
        def nodes(self):
            return [Node("n1", "idle", (), 2, 0, ("debug",), address="127.0.0.1")]

        def jobs(self, layout=None, **kw):
            polls.append(now[0])
            return []

    def sleep(dt):
        now[0] += dt

    w = ClusterWatcher(WatcherConfig(feed_dir=tmp_path, resync_s=10.0), Client(),
                       FeedStore(tmp_path), clock=lambda: now[0], wall=lambda: now[0],
                       sleep=sleep)
    w.role_of = lambda: (Role.STANDBY, "backup") if now[0] < 130.0 else (Role.ACTIVE, "in control")
    w.on_role = roles.append
    w.run(lambda: now[0] > 150.0)
    assert roles == [Role.STANDBY, Role.ACTIVE]
    # Within one role check of seeing itself active, plus the wait for the old one to stand down.
    assert polls and 133.0 <= polls[0] <= 135.1
    assert all(p >= 133.0 for p in polls)


def test_two_watchers_on_one_heartbeat_are_never_active_at_once(tmp_path):
    """The primary's and the backup's watchers, each on its own phase of role checks, over one
    heartbeat that moves to the backup at t=130 and back at t=170: at no instant do both poll
    (the taking-over one waits until the other has read the same heartbeat)."""
    from slurm_plugin.feed import ClusterWatcher, FeedStore, WatcherConfig
    from slurm_plugin.feed.watcher import RunState
    from slurm_plugin.slurm import Node

    now = [100.0]
    active_at: dict[int, list[float]] = {0: [], 1: []}

    class Client:
        def __init__(self, index):
            self.index = index

        def nodes(self):
            return [Node("n1", "idle", (), 2, 0, ("debug",), address="127.0.0.1")]

        def jobs(self, layout=None, **kw):
            active_at[self.index].append(now[0])
            return []

    def in_control():
        return 1 if 130.0 <= now[0] < 170.0 else 0

    watchers = []
    for index, phase in ((0, 0.0), (1, 1.3)):
        folder = tmp_path / str(index)
        w = ClusterWatcher(WatcherConfig(feed_dir=folder, resync_s=0.5, event_check_s=0.1),
                           Client(index), FeedStore(folder), clock=lambda: now[0],
                           wall=lambda: now[0], sleep=lambda dt: None)
        w.role_of = (lambda i: lambda: (Role.ACTIVE, "") if in_control() == i
                     else (Role.STANDBY, ""))(index)
        w.role = Role.ACTIVE if index == 0 else Role.STANDBY
        w.store.prepare()
        watchers.append((w, phase))
    # Both watchers' real passes (ClusterWatcher.step) on one clock, 0.1 s apart; at each
    # instant, which of them would poll.
    loops = [(w, phase, RunState(backoff=w.config.resync_s)) for w, phase in watchers]
    both = []
    while now[0] < 200.0:
        for w, phase, loop in loops:
            if now[0] >= 100.0 + phase:
                w.step(loop)
        if all(w.role is Role.ACTIVE for w, _, _ in loops):
            both.append(now[0])
        now[0] = round(now[0] + 0.1, 6)
    assert both == []
    spans = {i: (min(ts), max(ts)) for i, ts in active_at.items() if ts}
    assert 130.0 < spans[1][0] <= 130.0 + 2.0 + 1.3 + 3.0 + 0.2 and spans[1][1] < 172.0
    assert [t for t in active_at[0] if 130.0 <= t < 170.0] == []
    assert [t for t in active_at[1] if not 130.0 <= t < 170.0 + 2.0 + 1.3] == []


def test_a_watcher_whose_control_moved_during_a_poll_writes_nothing(tmp_path):
    """The role is asked again after Slurm's commands return (they can take many seconds):
    a watcher that is no longer active publishes nothing."""
    from slurm_plugin.feed import ClusterWatcher, FeedStore, WatcherConfig
    from slurm_plugin.slurm import Node

    role = [Role.ACTIVE]

    class Client:
        def nodes(self):
            return [Node("n1", "idle", (), 2, 0, ("debug",), address="127.0.0.1")]

        def jobs(self, layout=None, **kw):
            role[0] = Role.STANDBY              # control moved while squeue ran
            return []

    store = FeedStore(tmp_path)
    store.prepare()
    w = ClusterWatcher(WatcherConfig(feed_dir=tmp_path), Client(), store)
    w.role_of = lambda: (role[0], "")
    result = w.poll()
    assert result.error == "no longer the active watcher" and result.nodes_written == []
    assert store.read_node("n1") is None
    role[0] = Role.ACTIVE
    w.client.jobs = lambda layout=None, **kw: []
    assert w.poll().nodes_written == ["n1"]
