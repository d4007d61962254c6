"""The feed link's two ends on loopback: a real LinkServer and LinkClient, real sockets, real
folders (the watcher's and a node's), the key file way and munge's (a private munged)."""
from __future__ import annotations

import json
import os
import socket
import shutil
import subprocess
import tempfile
import time

import pytest
from pathlib import Path

from malleable_policy.request import MalleableSpec
from slurm_plugin.feed.link import KeyAuth, MungeAuth
from slurm_plugin.feed.link_client import LinkClient
from slurm_plugin.feed.link_server import LinkServer, peers
from slurm_plugin.feed.model import FeedJob, NodeFeed, NodeReport, Offers
from slurm_plugin.feed.munge import Munge
from slurm_plugin.feed.store import FeedStore

from ...integration.helpers import wait_for as wait_until

KEY = b"k" * 40


def wait_for(check, what):
    # 30 s: under a full machine (the VM cluster's emulation beside the unit suite) one of these
    # waits ran past 10 s once; a wait returns as soon as its check holds.
    return wait_until(check, timeout=30, what=what)


def feed(node, *jobs):
    return NodeFeed(node, 2, tuple(jobs), updated=time.time())


def job(job_id, nodes, cpus=frozenset({0})):
    return FeedJob(job_id, 1000, "u", cpus, tuple(nodes), MalleableSpec(1, None))


@pytest.fixture
def link(tmp_path):
    pokes = []
    watcher = FeedStore(tmp_path / "watcher")
    watcher.prepare()
    server = LinkServer(FeedStore(watcher.feed_dir), KeyAuth(KEY), port=0,
                        address="127.0.0.1", on_poke=lambda: pokes.append(1))
    port = server.start()
    clients = {}

    def connect(node, auth=KeyAuth(KEY)):
        store = FeedStore(tmp_path / f"node-{node}")
        c = LinkClient(node, ["127.0.0.1"], port, auth, store, retry_s=0.1)
        c.start()
        clients[node] = c
        return c
    yield server, watcher, connect, pokes
    for c in clients.values():
        c.stop()
    server.stop()


def test_feeds_go_down_and_offers_reports_usage_and_pokes_come_up(link):
    server, watcher, connect, pokes = link
    n1 = connect("n1")
    wait_for(lambda: server.connected() == ["n1"], "n1's link open")
    server.publish({"n1": feed("n1", job(7, ["n1"]))})
    wait_for(lambda: n1.store.read_node("n1"), "n1's feed on the node")
    assert n1.store.read_node("n1").job(7).job_id == 7

    n1.store.write_offers(Offers("n1", {7: 2}))
    n1.store.write_report(NodeReport("n1", ()))
    wait_for(lambda: FeedStore(watcher.feed_dir).read_offers("n1"), "n1's offers at the watcher")
    wait_for(lambda: FeedStore(watcher.feed_dir).read_report("n1"), "n1's report")

    n1.store.write_usage(7, "n1", json.dumps({"job": 7}).encode())
    wait_for(lambda: watcher.usage_files() == {7: ["7.n1.json"]}, "the usage at the watcher")
    wait_for(lambda: n1.store.usage_files() == {}, "the node's copy removed once acknowledged")

    n1.store.poke_watcher()
    wait_for(lambda: pokes, "the poke")
    server.polled(1234.5)
    wait_for(lambda: n1.store.polled_at() == 1234.5, "the poll time on the node")


def test_a_poll_under_way_when_a_node_pokes_does_not_answer_its_poke(link):
    """A node that stopped being quiet waits for a poll begun after that (node/quiet.py). A
    poll already under way when its poke came is published to it, but the node stays poked:
    the next poll's time goes to it too, without another poke. (Before, the earlier poll
    answered the poke, and the next poll's time went nowhere until the node asked again.)"""
    server, _, connect, pokes = link
    n1 = connect("n1")
    wait_for(lambda: server.connected() == ["n1"], "n1's link open")
    began_before = time.time() - 5.0
    n1.store.poke_watcher()
    wait_for(lambda: pokes, "the poke")
    server.polled(began_before)
    wait_for(lambda: n1.store.polled_at() == began_before, "the earlier poll's time")
    after = time.time() + 1.0
    server.polled(after)
    wait_for(lambda: n1.store.polled_at() == after, "the next poll's time, unasked")
    server.polled(after + 1.0)                     # answered: not poked any more
    time.sleep(0.3)
    assert n1.store.polled_at() == after


def test_a_multi_node_jobs_offers_reach_its_other_nodes_only(link):
    server, _, connect, _ = link
    n1, n2, n3 = connect("n1"), connect("n2"), connect("n3")
    wait_for(lambda: server.connected() == ["n1", "n2", "n3"], "three links open")
    feeds = {"n1": feed("n1", job(8, ["n1", "n2"])), "n2": feed("n2", job(8, ["n1", "n2"])),
             "n3": feed("n3", job(9, ["n3"]))}
    assert peers(feeds, "n1") == {"n2"} and peers(feeds, "n3") == set()
    server.publish(feeds)
    wait_for(lambda: n2.store.read_node("n2"), "n2's feed")
    n2.store.write_offers(Offers("n2", {8: 1}))
    wait_for(lambda: n1.store.read_offers("n2"), "n2's offers on n1")
    n3.store.write_offers(Offers("n3", {9: 1}))
    wait_for(lambda: FeedStore(server.store.feed_dir).read_offers("n3"), "n3's at the watcher")
    time.sleep(0.2)
    assert n1.store.read_offers("n3") is None and n2.store.read_offers("n3") is None


def test_a_node_without_the_key_gets_nothing(link, tmp_path):
    server, _, connect, _ = link
    server.publish({"n1": feed("n1", job(7, ["n1"]))})
    intruder = connect("n1", auth=KeyAuth(b"x" * 40))
    wait_for(lambda: server.stats.refused >= 2, "the intruder refused (and retrying)")
    assert server.connected() == [] and intruder.store.read_node("n1") is None


def test_a_forged_frame_closes_the_connection(link):
    """Someone on the network who can write into the stream but has no session key."""
    server, _, connect, _ = link
    n1 = connect("n1")
    wait_for(lambda: server.connected() == ["n1"], "n1's link open")
    before = n1.connects
    raw = socket.create_connection(("127.0.0.1", server.port))
    raw.sendall((40).to_bytes(4, "big") + b"\0" * 40)
    wait_for(lambda: server.stats.refused >= 1, "the stranger's frame refused")
    raw.close()
    assert server.connected() == ["n1"] and n1.connects == before


def test_connections_held_in_their_handshake_block_only_their_own_address(link):
    """Anyone on a node can open connections to the port and say nothing: from one address
    only MAX_UNOPENED_PER_ADDRESS wait for their handshake; a node elsewhere still connects."""
    from slurm_plugin.feed.link_server import MAX_UNOPENED_PER_ADDRESS
    server, _, connect, _ = link
    held = [socket.create_connection(("127.0.0.1", server.port), source_address=("127.0.0.2", 0))
            for _ in range(MAX_UNOPENED_PER_ADDRESS + 3)]
    try:
        wait_for(lambda: server.stats.refused >= 3, "the connections past the cap refused")
        n1 = connect("n1")                                   # from 127.0.0.1
        wait_for(lambda: server.connected() == ["n1"], "n1's link open beside the held ones")
        assert n1.connects == 1
    finally:
        for s in held:
            s.close()


def test_a_handshake_waiting_on_munged_holds_up_no_open_link(tmp_path):
    """munge's calls wait on munged: while one node's hello waits (here: its check blocks),
    the nodes already connected get their feeds; the waiting one opens once it is checked."""
    import threading
    gate = threading.Event()

    class SlowAuth(KeyAuth):
        def check_client(self, node, client_nonce, token):
            if node == "n2":
                gate.wait(30)
            return super().check_client(node, client_nonce, token)

    watcher = FeedStore(tmp_path / "watcher")
    watcher.prepare()
    server = LinkServer(FeedStore(watcher.feed_dir), SlowAuth(KEY), port=0, address="127.0.0.1")
    port = server.start()
    n1, n2 = (LinkClient(n, ["127.0.0.1"], port, KeyAuth(KEY), FeedStore(tmp_path / f"node-{n}"),
                         retry_s=0.1) for n in ("n1", "n2"))
    try:
        n1.start()
        wait_for(lambda: server.connected() == ["n1"], "n1's link open")
        n2.start()
        time.sleep(0.5)                                      # n2's hello is being checked
        server.publish({"n1": feed("n1", job(7, ["n1"])), "n2": feed("n2", job(8, ["n2"]))})
        wait_for(lambda: n1.store.read_node("n1"), "n1's feed while n2's check waits")
        assert server.connected() == ["n1"] and n2.store.read_node("n2") is None
        gate.set()
        wait_for(lambda: n2.store.read_node("n2"), "n2's feed once its hello is checked")
        assert server.connected() == ["n1", "n2"]
    finally:
        gate.set()
        n1.stop()
        n2.stop()
        server.stop()


def test_munge_proves_both_ends_are_root(tmp_path):
    # munged wants every folder above its socket open to all (pytest's are 0700).
    run = Path(tempfile.mkdtemp(prefix="link-munge-", dir="/tmp"))
    os.chmod(run, 0o755)
    sock = run / "munge.sock"
    key = tmp_path / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)
    munged = subprocess.Popen(["munged", "-F", f"--key-file={key}", f"--socket={sock}",
                               f"--pid-file={tmp_path / 'pid'}", f"--log-file={tmp_path / 'log'}",
                               f"--seed-file={tmp_path / 'seed'}"])
    try:
        wait_for(sock.exists, "munged's socket")
        auth = MungeAuth(Munge(str(sock)))
        watcher = FeedStore(tmp_path / "watcher")
        server = LinkServer(watcher, auth, port=0, address="127.0.0.1")
        port = server.start()
        client = LinkClient("n1", ["127.0.0.1"], port, auth, FeedStore(tmp_path / "n1"))
        client.start()
        try:
            wait_for(lambda: server.connected() == ["n1"], "the munge handshake")
            server.publish({"n1": feed("n1", job(7, ["n1"]))})
            wait_for(lambda: client.store.read_node("n1"), "the feed over a munge session")
        finally:
            client.stop()
            server.stop()
    finally:
        munged.terminate()
        munged.wait(10)
        shutil.rmtree(run, ignore_errors=True)


def test_a_feed_sent_right_behind_the_handshake_is_taken(link):
    """The watcher sends the node's feed in the same write as its handshake reply: the
    client's handshake reader hands it on (it once dropped it)."""
    server, _, connect, _ = link
    for round_ in range(5):
        server.publish({f"m{round_}": feed(f"m{round_}", job(7, [f"m{round_}"]))})
        node = connect(f"m{round_}")
        wait_for(lambda: node.store.read_node(f"m{round_}"), "the feed published before")
