"""How an agent learns of feed changes without polling a shared file system (feed/notify.py),
and the store's cached reads that go with it. Real inotify, real UDP on loopback."""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from malleable_protocol.safe_io import write_atomic
from slurm_plugin.feed import ClusterWatcher, FeedStore, NodeFeed, WatcherConfig
from slurm_plugin.feed.notify import (FeedMode, InotifyWatch, WakeListener, encode_wake,
                                      feed_mode_of, fs_type_of, is_wake_for, send_wake)
from slurm_plugin.slurm import Node

FIX = Path(__file__).resolve().parents[2] / "fixtures"
MOUNTINFO = """\
22 1 8:1 / / rw,relatime - ext4 /dev/vda rw
30 22 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw
40 22 0:40 / /shared rw - nfs4 srv:/export rw,vers=4.2
41 40 0:41 / /shared/local rw - xfs /dev/vdb rw
50 22 0:50 / /run rw - tmpfs tmpfs rw
51 22 0:51 / /lustre rw - lustre 10.0.0.1@tcp:/fs rw
"""


@pytest.mark.parametrize("path, fstype, mode", [
    ("/work/feed", "ext4", FeedMode.LOCAL), ("/run/malleable/feed", "tmpfs", FeedMode.LOCAL),
    ("/shared/malleable/feed", "nfs4", FeedMode.SHARED), ("/shared", "nfs4", FeedMode.SHARED),
    ("/shared/local/feed", "xfs", FeedMode.LOCAL), ("/sharedx/feed", "ext4", FeedMode.LOCAL),
    ("/lustre/feed", "lustre", FeedMode.SHARED),
])
def test_the_feed_mode_follows_the_folders_file_system(path, fstype, mode):
    assert fs_type_of(path, MOUNTINFO) == fstype
    assert feed_mode_of(fstype) is mode


def test_an_unknown_file_system_is_treated_as_shared():
    assert feed_mode_of("") is FeedMode.SHARED and feed_mode_of("fuse.sshfs") is FeedMode.SHARED
    real = (FIX / "host-cgroup-v1" / "mountinfo.txt").read_text()
    assert fs_type_of("/sys/fs/cgroup/cpuset/slurm", real) == "cgroup"


@given(st.text(max_size=200), st.text(max_size=40))
def test_fs_type_of_never_raises(mountinfo, path):
    fs_type_of("/" + path, mountinfo)


def test_a_wake_names_its_node_and_nothing_else_counts():
    assert is_wake_for(encode_wake("n1"), "n1")
    for other in (encode_wake("n2"), b"feed n1", b"feed n1\n\n", b"x" * 200, b""):
        assert not is_wake_for(other, "n1")


def test_the_wake_listener_wakes_on_its_nodes_datagrams_only():
    woken = threading.Event()
    count = []
    listener = WakeListener("n1", 0, lambda: (count.append(1), woken.set()),
                            address="127.0.0.1")
    port = listener.start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for junk in (b"feed n2\n", b"\xff" * 1000, b""):
                s.sendto(junk, ("127.0.0.1", port))
        time.sleep(0.2)
        assert not woken.is_set()
        send_wake("127.0.0.1", port, "n1")
        assert woken.wait(5)
        for _ in range(50):                   # a storm: at most one wake per 50 ms
            send_wake("127.0.0.1", port, "n1")
        time.sleep(0.3)
        assert listener.wakes <= 1 + 0.3 / 0.05 + 1 and listener.dropped == 3
    finally:
        listener.stop()
    send_wake("127.0.0.1", port, "n1")      # nobody listening: no error


def test_inotify_sees_a_file_written_into_place(tmp_path):
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    seen: list[set[str]] = []
    changed = threading.Event()
    watch = InotifyWatch([nodes], lambda names: (seen.append(names), changed.set()))
    watch.start()
    try:
        write_atomic(nodes, "n1.json", b"{}")
        assert changed.wait(5)
        deadline = time.monotonic() + 5        # the temporary file's events may come first
        while not any("n1.json" in names for names in seen) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert any("n1.json" in names for names in seen), seen
    finally:
        watch.stop()


def test_inotify_on_a_missing_folder_is_an_error(tmp_path):
    with pytest.raises(OSError):
        InotifyWatch([tmp_path / "missing"], lambda names: None).start()


def feed(node="n1", updated=1.0):
    return NodeFeed(node=node, cpus=2, jobs=(), updated=updated)


def test_a_refreshing_store_answers_from_memory_until_invalidated(tmp_path):
    now = [0.0]
    writer = FeedStore(tmp_path)
    writer.prepare()
    writer.write_node(feed(updated=1.0))
    reader = FeedStore(tmp_path, refresh_s=10.0, clock=lambda: now[0])
    stamp = reader.node_stamp("n1")
    assert reader.read_node("n1").updated == 1.0
    writer.write_node(feed(updated=2.0))
    now[0] = 5.0
    assert reader.read_node("n1").updated == 1.0            # within refresh_s: no stat
    assert reader.node_changed("n1", stamp) == (True, reader.node_stamp("n1"))
    assert reader.read_node("n1").updated == 2.0            # a change seen drops the cache
    writer.write_node(feed(updated=3.0))
    assert reader.node_changed("n1", reader.node_stamp("n1"))[0] is False   # looked at 5.0
    assert reader.read_node("n1").updated == 2.0
    reader.invalidate()                                     # told (inotify, a wake)
    assert reader.read_node("n1").updated == 3.0
    now[0] = 16.0
    assert reader.read_offers("n2") is None                 # missing: known missing
    Path(tmp_path / "offers").mkdir(exist_ok=True)
    from slurm_plugin.feed import Offers
    writer.write_offers(Offers("n2", {7: 1}))
    assert reader.read_offers("n2") is None
    now[0] = 27.0
    assert reader.read_offers("n2").per_rank == {7: 1}      # refresh_s later: looked at again


def test_the_watcher_wakes_the_agents_that_registered(tmp_path):
    store = FeedStore(tmp_path)
    store.prepare()
    store.register_agent("n1", 40123)
    (store.agents_dir / "n2.json").write_text('{"node": "n1", "wake_port": 1}')  # not n2's
    sent = []

    class Client:
        def nodes(self):
            return [Node("n1", "idle", (), 2, 0, ("debug",), address="10.0.0.1"),
                    Node("n2", "idle", (), 2, 0, ("debug",), hostname="h2")]

        def jobs(self, layout=None, **kw):
            return []

    w = ClusterWatcher(WatcherConfig(feed_dir=tmp_path), Client(), store,
                       send_wake=lambda *a: sent.append(a))
    assert sorted(w.poll().nodes_written) == ["n1", "n2"]
    assert sent == [("10.0.0.1", 40123, "n1")]
    assert w.poll().nodes_written == [] and len(sent) == 1    # nothing written, nobody woken


def test_an_agent_without_inotify_takes_wakes_instead(tmp_path, monkeypatch):
    """inotify failing (out of watches) does not stop the agent: it registers a wake port."""
    from slurm_plugin.daemon import agent as agent_mod
    from slurm_plugin.node.config import AgentConfig
    from slurm_plugin.feed import notify

    def no_inotify(self):
        raise OSError(28, "inotify_add_watch: No space left on device")
    monkeypatch.setattr(notify.InotifyWatch, "start", no_inotify)
    config = AgentConfig(node="n1", state_dir=tmp_path, feed_dir=tmp_path / "feed",
                         feed_mode="local")
    store = FeedStore(config.feed_dir)
    store.prepare()
    watch = agent_mod.watch_feed(config, store, lambda *_: None)
    try:
        assert isinstance(watch, WakeListener) and store.agent_wake_port("n1") == watch.port
    finally:
        watch.stop()


def test_a_wake_port_taken_first_does_not_stop_the_agent(tmp_path):
    """Issue 40, finding 8: with a fixed wake port a local user bound first, the agent exited
    at start and its service restarted it into the same wall. It takes any free port, and
    registers it, as with port 0."""
    import socket
    from slurm_plugin.daemon import agent as agent_mod
    from slurm_plugin.node.config import AgentConfig
    squatter = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    squatter.bind(("0.0.0.0", 0))
    taken = squatter.getsockname()[1]
    config = AgentConfig(node="n1", state_dir=tmp_path, feed_dir=tmp_path / "feed",
                         feed_mode="shared", wake_port=taken)
    store = FeedStore(config.feed_dir)
    store.prepare()
    try:
        watch = agent_mod.watch_feed(config, store, lambda *_: None)
        try:
            assert watch.port != taken and store.agent_wake_port("n1") == watch.port
        finally:
            watch.stop()
    finally:
        squatter.close()
