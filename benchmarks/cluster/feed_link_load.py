"""What the feed link costs with 1,000 nodes on one watcher: the real LinkServer (its own
process, as the watcher's thread) and 1,000 simulated agents (another process: one selector
over 1,000 TCP connections on loopback, each speaking the link's real handshake and sealed
frames, key authentication). Three phases, measured side by side in one run:

- idle: nothing changes (the agents' keep-alives only);
- churn: every second, 10% of the nodes' feeds change (jobs starting and ending);
- burst: every node's feed changes at once (the site's kill switch, a controller restart).

Per phase: bytes and messages per node per second each way, the server's CPU seconds per
second, and the staleness of each delivered feed (its publish time to its arrival) p50/p99.
Also the handshake's cost with munge (a private munged) against the key file's, 100 each.
slurmctld's load does not change with the link (it talks to the watcher only):
benchmarks/cluster/slurmctld_load.py measures that.

    python -m benchmarks.cluster.feed_link_load [--nodes 1000] [--seconds 20]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import selectors
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine, median, percentile, save

from malleable_policy.request import MalleableSpec
from slurm_plugin.feed.link import (ClientHandshake, FrameReader, KeyAuth, MungeAuth,
                                    server_handshake)
from slurm_plugin.feed.model import FeedJob, NodeFeed
from slurm_plugin.feed.munge import Munge

PING_S = 20.0


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def node_name(i: int) -> str:
    return f"node{i:04d}"


def feed_of(i: int, version: int) -> NodeFeed:
    """A node with 4 jobs on 64 cores; ``version`` changes one job (a start or an end)."""
    jobs = tuple(FeedJob(1000 * version + k, 1000 + k, f"user{k}", frozenset(range(16 * k,
                                                                                    16 * k + 16)),
                         (node_name(i),), MalleableSpec(8, 32) if k % 2 else None)
                 for k in range(4))
    return NodeFeed(node_name(i), 64, jobs, updated=time.time())


def server_main(port_q, cmd_q, out_q, nodes: int, key: bytes) -> None:
    """The watcher's side: the real LinkServer; publishes as the phases ask."""
    from slurm_plugin.feed.link_server import LinkServer
    from slurm_plugin.feed.store import FeedStore
    _raise_fd_limit()
    folder = Path(tempfile.mkdtemp(prefix="link-load-watcher-"))
    server = LinkServer(FeedStore(folder), KeyAuth(key), port=0, address="127.0.0.1")
    port_q.put(server.start())
    feeds = {node_name(i): feed_of(i, 0) for i in range(nodes)}
    versions = [0] * nodes
    while True:
        cmd = cmd_q.get()
        if cmd[0] == "stop":
            break
        if cmd[0] == "publish":
            for i in cmd[1]:
                versions[i] += 1
                feeds[node_name(i)] = feed_of(i, versions[i])
            server.publish(feeds)
        elif cmd[0] == "stats":
            t = os.times()
            out_q.put({"cpu_s": t.user + t.system, "connected": len(server.connected()),
                       **server.stats.__dict__})
    server.stop()
    shutil.rmtree(folder, ignore_errors=True)


def clients_main(port: int, nodes: int, key: bytes, seconds_q, out_q) -> None:
    """1,000 agents' link ends in one selector; every feed's arrival time is noted."""
    _raise_fd_limit()
    sel = selectors.DefaultSelector()
    conns = {}
    for i in range(nodes):
        s = socket.create_connection(("127.0.0.1", port))
        hand = ClientHandshake(node_name(i), KeyAuth(key))
        s.sendall(hand.hello())
        reader = FrameReader()
        body = None
        while body is None:
            body = next(reader.feed(s.recv(65536)), None)
        session = hand.finish(body)
        rest = reader.take_rest()
        s.setblocking(False)
        conns[s] = {"session": session, "reader": reader, "last_out": time.monotonic(),
                    "pending": rest}
        sel.register(s, selectors.EVENT_READ)
    out_q.put("connected")
    arrivals: list[tuple[float, float]] = []          # (arrival, feed's publish time)
    sent = {"frames": 0, "bytes": 0}
    while True:
        try:
            stop_at = seconds_q.get_nowait()
        except Exception:   # noqa: BLE001 - queue.Empty
            stop_at = None
        if stop_at == "stop":
            break
        if stop_at == "report":
            out_q.put({"arrivals": arrivals, "sent": dict(sent)})
            arrivals, sent = [], {"frames": 0, "bytes": 0}
        for key, _ in sel.select(timeout=0.05):
            c = conns[key.fileobj]
            data = c["pending"] + key.fileobj.recv(1 << 16)
            c["pending"] = b""
            now = time.time()
            for body in c["reader"].feed(data):
                m = c["session"].open(body)
                if m["t"] == "node":
                    arrivals.append((now, json.loads(m["data"])["updated"]))
        now = time.monotonic()
        for s, c in conns.items():
            if now - c["last_out"] >= PING_S:
                frame = c["session"].seal({"t": "ping"})
                s.sendall(frame)
                sent["frames"] += 1
                sent["bytes"] += len(frame)
                c["last_out"] = now
    for s in conns:
        s.close()


def handshake_cost(auth, n: int) -> float:
    """Median seconds of one whole handshake (both sides, one process)."""
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        hand = ClientHandshake(node_name(i), auth)
        (hello,) = FrameReader().feed(hand.hello())
        _, reply, _ = server_handshake(hello, auth)
        hand.finish(next(FrameReader().feed(reply)))
        times.append(time.perf_counter() - t0)
    return median(times)


def munge_handshakes(n: int) -> float | None:
    if shutil.which("munged") is None:
        return None
    run = Path(tempfile.mkdtemp(prefix="link-load-munge-", dir="/tmp"))
    os.chmod(run, 0o755)
    key = run / "key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)
    sock = run / "sock"
    munged = subprocess.Popen(["munged", "-F", f"--key-file={key}", f"--socket={sock}",
                               f"--pid-file={run / 'pid'}", f"--log-file={run / 'log'}",
                               f"--seed-file={run / 'seed'}"])
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        return handshake_cost(MungeAuth(Munge(str(sock))), n)
    finally:
        munged.terminate()
        munged.wait(10)
        shutil.rmtree(run, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20.0, help="per phase")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    key = os.urandom(48)
    port_q, cmd_q, out_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
    server = ctx.Process(target=server_main, args=(port_q, cmd_q, out_q, args.nodes, key))
    server.start()
    port = port_q.get(timeout=30)
    cl_in, cl_out = ctx.Queue(), ctx.Queue()
    t0 = time.monotonic()
    clients = ctx.Process(target=clients_main, args=(port, args.nodes, key, cl_in, cl_out))
    clients.start()
    assert cl_out.get(timeout=300) == "connected"
    connect_s = time.monotonic() - t0
    cmd_q.put(("publish", []))             # every node's first feed
    time.sleep(3)
    cl_in.put("report")
    cl_out.get(timeout=60)

    def phase(name: str, each_second) -> dict:
        cmd_q.put(("stats",))
        before = out_q.get(timeout=30)
        start = time.monotonic()
        tick = 0
        while time.monotonic() - start < args.seconds:
            changed = each_second(tick)
            if changed is not None:
                cmd_q.put(("publish", changed))
            tick += 1
            time.sleep(max(0.0, start + tick - time.monotonic()))
        time.sleep(1.0)                      # the last ones arrive
        elapsed = time.monotonic() - start
        cmd_q.put(("stats",))
        after = out_q.get(timeout=30)
        cl_in.put("report")
        got = cl_out.get(timeout=60)
        stale = [arr - pub for arr, pub in got["arrivals"]]
        per_node_s = args.nodes * elapsed
        row = {
            "seconds": round(elapsed, 1),
            "feeds_delivered": len(stale),
            "staleness_ms_p50": round(median(stale) * 1000, 2) if stale else None,
            "staleness_ms_p99": round(percentile(stale, 99) * 1000, 2) if stale else None,
            "down_bytes_per_node_s": round((after["bytes_out"] - before["bytes_out"])
                                           / per_node_s, 2),
            "down_msgs_per_node_s": round((after["frames_out"] - before["frames_out"])
                                          / per_node_s, 4),
            "up_bytes_per_node_s": round((after["bytes_in"] - before["bytes_in"]) / per_node_s,
                                         2),
            "up_msgs_per_node_s": round((after["frames_in"] - before["frames_in"])
                                        / per_node_s, 4),
            "server_cpu_s_per_s": round((after["cpu_s"] - before["cpu_s"]) / elapsed, 4),
            "connected": after["connected"],
        }
        print(f"{name}: {row}")
        return row

    import random
    rng = random.Random(1)
    rows = {
        "idle": phase("idle", lambda tick: None),
        "churn_10pct_per_s": phase("churn", lambda tick: rng.sample(range(args.nodes),
                                                                    args.nodes // 10)),
        "burst_all_nodes": phase("burst", lambda tick: list(range(args.nodes))
                                 if tick == 0 else None),
    }
    cl_in.put("stop")
    cmd_q.put(("stop",))
    clients.join(30)
    server.join(30)
    hs_key = handshake_cost(KeyAuth(key), 100)
    hs_munge = munge_handshakes(100)
    data = {"machine": machine(), "nodes": args.nodes, "phases": rows,
            "connect_all_s": round(connect_s, 2),
            "handshake_ms_key": round(hs_key * 1000, 3),
            "handshake_ms_munge": None if hs_munge is None else round(hs_munge * 1000, 3),
            "feed_bytes": len(feed_of(0, 1).encode()),
            "note": "server and 1,000 simulated agents on one 2-core machine over loopback; "
                    "the agents' keep-alive is one frame per 20 s of silence"}
    save("feed_link_load", data)


if __name__ == "__main__":
    main()
