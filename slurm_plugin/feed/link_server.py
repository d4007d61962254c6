"""The watcher's end of the feed link (``link.py``): one listening TCP port, fixed and
configurable, one connection per node's agent, served by one thread over a selector.

To each node it sends that node's feed whenever it changes, the offers of the nodes it shares
a multi-node job with (``peers``), and, after a node asked for a poll (a poke), the time the
next published poll began. From each node it takes the node's offers and report (written into
the watcher's own folder, where ``malleable status`` reads them) and its jobs' usage (written
there too, then acknowledged so the node removes its copy).

Nothing here blocks the watcher's polls: ``publish`` and ``polled`` only queue. A node that
does not read what it is sent is dropped past ``MAX_PENDING_BYTES`` (it reconnects and is
sent everything again). Handshakes are checked by a few threads of their own (munge's calls
wait on munged): a munged that hangs delays new connections, not the open ones.
"""
from __future__ import annotations

import hashlib
import logging
import queue
import selectors
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping

from malleable_protocol import ProtocolError

from slurm_plugin.feed.link import (FrameReader, LinkAuth, LinkError, MAX_HANDSHAKE_BYTES,
                                    Session, keepalive, message_data, refusal,
                                    server_handshake)
from slurm_plugin.feed.model import NodeFeed, NodeReport, Offers
from slurm_plugin.feed.store import FeedStore
from slurm_plugin.feed.usage import MAX_USAGE_BYTES, parse_usage_file_name

log = logging.getLogger(__name__)

MAX_PENDING_BYTES = 16 << 20       # unsent bytes to one node before it is dropped
MAX_UNOPENED = 256                 # connections still in their handshake
# ... from one address: anyone on a node can connect, so a user holding connections open in
# their handshake blocks at most their own host's agent, not the cluster's.
MAX_UNOPENED_PER_ADDRESS = 8
HANDSHAKE_TIMEOUT_S = 5.0
HANDSHAKE_THREADS = 4


def peers(feeds: Mapping[str, NodeFeed], node: str) -> set[str]:
    """The other nodes of the multi-node jobs on ``node`` (their offers cap its jobs). Pure."""
    feed = feeds.get(node)
    if feed is None:
        return set()
    return {n for j in feed.jobs if len(j.nodes) > 1 for n in j.nodes} - {node}


@dataclass
class LinkStats:
    """Counted since the start (the benchmark's and the metrics')."""

    frames_out: int = 0
    bytes_out: int = 0
    frames_in: int = 0
    bytes_in: int = 0
    refused: int = 0
    dropped: int = 0


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    peer: str
    opened_at: float
    address: str = ""                  # the peer's IP address
    reader: FrameReader = field(default_factory=lambda: FrameReader(MAX_HANDSHAKE_BYTES))
    node: str | None = None
    session: Session | None = None
    out: bytearray = field(default_factory=bytearray)
    sent: dict[tuple[str, str], bytes] = field(default_factory=dict)   # what -> digest
    # When its node asked for a poll (wall time), until a poll begun after that is published.
    poked_at: float | None = None
    checking: bool = False             # its hello is with a handshake thread
    early: bytearray = field(default_factory=bytearray)   # what came meanwhile


class LinkServer:
    def __init__(self, store: FeedStore, auth: LinkAuth, *, port: int, address: str = "0.0.0.0",
                 on_poke: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.store, self.auth, self.port, self.address = store, auth, port, address
        self._on_poke, self._clock, self._wall = on_poke, clock, wall
        self.stats = LinkStats()
        self._feeds: dict[str, NodeFeed] = {}
        self._encoded: dict[str, bytes] = {}
        self._offers: dict[str, bytes] = {}
        self._conns: dict[str, _Conn] = {}       # open ones, by node
        self._queue: deque[Callable[[], None]] = deque()
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._listen: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Bounded: a connection that expires while its hello waits here leaves the caps' count.
        self._hellos: queue.Queue[tuple[_Conn, bytes] | None] = queue.Queue(MAX_UNOPENED)

    # --- the watcher's thread -------------------------------------------------------------

    def start(self) -> int:
        """Binds (port 0: any free one, for tests) and starts serving; returns the port."""
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.address, self.port))
        s.listen(1024)
        s.setblocking(False)
        self.port = s.getsockname()[1]
        self._listen = s
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(s, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._serve, name="feed-link", daemon=True)
        self._thread.start()
        for i in range(HANDSHAKE_THREADS):
            # Daemon threads: one waiting on a hung munged must not hold the watcher's exit.
            threading.Thread(target=self._check_hellos, name=f"feed-link-handshake-{i}",
                             daemon=True).start()
        return self.port

    def stop(self) -> None:
        self._stop.set()
        for _ in range(HANDSHAKE_THREADS):
            try:
                self._hellos.put_nowait(None)
            except queue.Full:         # the threads are daemons: they end with the process
                break
        self._call(lambda: None)
        if self._thread is not None:
            self._thread.join(5)
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()       # type: ignore[union-attr]
        self._sel.close()
        if self._wake_w is not None:
            self._wake_w.close()

    def publish(self, feeds: Mapping[str, NodeFeed]) -> None:
        """The feeds of the latest poll (every node's): changed ones go to their nodes."""
        snapshot = dict(feeds)
        self._call(lambda: self._publish(snapshot))

    def polled(self, at: float) -> None:
        """A poll that began at ``at`` (wall time) is published: nodes that poked are told."""
        self._call(lambda: self._polled(at))

    def connected(self) -> list[str]:
        with self._lock:
            return sorted(self._conns)

    def _call(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._queue.append(fn)
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except (BlockingIOError, OSError):
                pass

    # --- the link's thread ----------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, mask in self._sel.select(timeout=1.0):
                if key.fileobj is self._listen:
                    self._accept()
                elif key.fileobj is self._wake_r:
                    self._drain_wakes()
                else:
                    conn: _Conn = key.data
                    if mask & selectors.EVENT_READ:
                        self._read(conn)
                    if mask & selectors.EVENT_WRITE and conn.sock.fileno() >= 0:
                        self._flush(conn)
            self._expire_handshakes()

    def _drain_wakes(self) -> None:
        try:
            while self._wake_r.recv(4096):     # type: ignore[union-attr]
                pass
        except BlockingIOError:
            pass
        while True:
            with self._lock:
                if not self._queue:
                    return
                fn = self._queue.popleft()
            fn()

    def _accept(self) -> None:
        try:
            sock, addr = self._listen.accept()     # type: ignore[union-attr]
        except (BlockingIOError, OSError):
            return
        unopened = [k.data for k in self._sel.get_map().values()
                    if isinstance(k.data, _Conn) and k.data.session is None]
        if len(unopened) >= MAX_UNOPENED or \
                sum(1 for c in unopened if c.address == addr[0]) >= MAX_UNOPENED_PER_ADDRESS:
            sock.close()
            self.stats.refused += 1
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        keepalive(sock)
        conn = _Conn(sock, f"{addr[0]}:{addr[1]}", self._clock(), address=addr[0])
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _expire_handshakes(self) -> None:
        now = self._clock()
        for key in list(self._sel.get_map().values()):
            c = key.data
            if isinstance(c, _Conn) and c.session is None and \
                    now - c.opened_at > HANDSHAKE_TIMEOUT_S:
                self._close(c, "no handshake in time")

    def _close(self, conn: _Conn, why: str) -> None:
        if conn.node is not None and self._conns.get(conn.node) is conn:
            with self._lock:
                del self._conns[conn.node]
            log.info("link %s (%s) closed: %s", conn.node, conn.peer, why)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError as exc:
            self._close(conn, str(exc))
            return
        if not data:
            self._close(conn, "closed by the node")
            return
        self.stats.bytes_in += len(data)
        try:
            if conn.checking:
                conn.early += data
                if len(conn.early) > MAX_HANDSHAKE_BYTES:
                    raise LinkError("frames before the handshake's reply")
                return
            if conn.session is None:
                body = next(conn.reader.feed(data), None)
                if body is None:
                    return
                self.stats.frames_in += 1
                conn.early += conn.reader.take_rest()
                conn.reader = FrameReader()
                conn.checking = True
                try:
                    self._hellos.put_nowait((conn, body))
                except queue.Full:
                    raise LinkError("too many hellos waiting to be checked") from None
                return
            self._frames(conn, data)
        except LinkError as exc:
            self._refuse(conn, exc)

    def _frames(self, conn: _Conn, data: bytes) -> None:
        for body in conn.reader.feed(data):
            self.stats.frames_in += 1
            self._take(conn, conn.session.open(body))   # type: ignore[union-attr]
            if conn.sock.fileno() < 0:
                return

    def _refuse(self, conn: _Conn, exc: LinkError) -> None:
        self.stats.refused += conn.session is None
        log.warning("link from %s (%s) refused: %s", conn.node or "?", conn.peer, exc)
        if conn.session is None:
            _send_now(conn.sock, refusal(str(exc)))
        self._close(conn, str(exc))

    def _check_hellos(self) -> None:
        """A handshake thread: checks hellos (munge's decode and encode) off the link's
        thread, and hands the outcome back to it."""
        while (item := self._hellos.get()) is not None:
            conn, body = item
            if conn.sock.fileno() < 0:          # gone meanwhile (its 5 s passed)
                continue
            try:
                outcome: tuple[str, bytes, Session] | LinkError = \
                    server_handshake(body, self.auth)
            except LinkError as exc:
                outcome = exc
            except Exception as exc:      # noqa: BLE001 (a handshake thread must not die)
                log.exception("link from %s: checking its hello failed", conn.peer)
                outcome = LinkError(f"its hello could not be checked: {type(exc).__name__}")
            self._call(lambda c=conn, o=outcome: self._checked(c, o))

    def _checked(self, conn: _Conn, outcome: tuple[str, bytes, Session] | LinkError) -> None:
        if conn.sock.fileno() < 0:
            return
        conn.checking = False
        try:
            if isinstance(outcome, LinkError):
                raise outcome
            self._open(conn, *outcome)
            early, conn.early = bytes(conn.early), bytearray()
            self._frames(conn, early)
        except LinkError as exc:
            self._refuse(conn, exc)

    def _open(self, conn: _Conn, node: str, reply: bytes, session: Session) -> None:
        conn.node, conn.session = node, session
        old = self._conns.get(node)
        if old is not None:
            self._close(old, "replaced by a new connection")
        with self._lock:
            self._conns[node] = conn
        log.info("link %s open (%s)", node, conn.peer)
        self._queue_bytes(conn, reply)
        self._send_state(conn)

    def _take(self, conn: _Conn, m: dict) -> None:
        kind, node = m["t"], conn.node
        assert node is not None
        try:
            if kind == "offers":
                data = message_data(m)
                offers = Offers.decode(data)
                if offers.node != node:
                    raise LinkError(f"offers of {offers.node} from {node}")
                self.store.write_offers(offers)
                self._offers[node] = data
                for other, c in list(self._conns.items()):
                    if node in peers(self._feeds, other):
                        self._send_file(c, "offers", node, data)
            elif kind == "report":
                report = NodeReport.decode(message_data(m))
                if report.node != node:
                    raise LinkError(f"a report of {report.node} from {node}")
                self.store.write_report(report)
            elif kind == "usage":
                name, data = m.get("name"), message_data(m)
                parsed = parse_usage_file_name(name) if isinstance(name, str) else None
                if parsed is None or parsed[1] != node or len(data) > MAX_USAGE_BYTES:
                    raise LinkError(f"a bad usage file from {node}")
                self.store.write_usage(parsed[0], node, data)
                self._send(conn, {"t": "ack", "name": name})
            elif kind == "poke":
                if conn.poked_at is None:
                    conn.poked_at = self._wall()
                self._on_poke()
            elif kind != "ping":
                raise LinkError(f"an unknown message {kind[:20]!r}")
        except ProtocolError as exc:
            raise LinkError(f"from {node}: {exc}") from None
        except OSError as exc:
            log.warning("link %s: %s not kept: %s", node, kind, exc)

    def _publish(self, feeds: dict[str, NodeFeed]) -> None:
        for name, feed in feeds.items():
            if self._feeds.get(name) is not feed:      # the watcher keeps unchanged ones
                self._encoded[name] = feed.encode()
        self._feeds = feeds
        for conn in list(self._conns.values()):
            self._send_state(conn)

    def _polled(self, at: float) -> None:
        """Nodes that poked are told; each still waits for a poll begun after its poke (one
        that was under way when the poke came lists nothing newer), so it stays poked."""
        for conn in list(self._conns.values()):
            if conn.poked_at is not None:
                if at >= conn.poked_at:
                    conn.poked_at = None
                self._send(conn, {"t": "polled", "at": at})

    def _send_state(self, conn: _Conn) -> None:
        node = conn.node
        assert node is not None
        data = self._encoded.get(node)
        if data is not None:
            self._send_file(conn, "node", node, data)
        for other in sorted(peers(self._feeds, node)):
            if other in self._offers:
                self._send_file(conn, "offers", other, self._offers[other])

    def _send_file(self, conn: _Conn, kind: str, node: str, data: bytes) -> None:
        digest = hashlib.sha256(data).digest()
        if conn.sent.get((kind, node)) == digest:
            return
        conn.sent[(kind, node)] = digest
        self._send(conn, {"t": kind, "node": node, "data": data.decode()})

    def _send(self, conn: _Conn, message: dict) -> None:
        assert conn.session is not None
        self._queue_bytes(conn, conn.session.seal(message))
        self.stats.frames_out += 1

    def _queue_bytes(self, conn: _Conn, data: bytes) -> None:
        conn.out += data
        if len(conn.out) > MAX_PENDING_BYTES:
            self.stats.dropped += 1
            self._close(conn, f"over {MAX_PENDING_BYTES} bytes unread")
            return
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        if conn.sock.fileno() < 0:
            return
        try:
            while conn.out:
                n = conn.sock.send(conn.out)
                self.stats.bytes_out += n
                del conn.out[:n]
        except BlockingIOError:
            pass
        except OSError as exc:
            self._close(conn, str(exc))
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        try:
            self._sel.modify(conn.sock, events, conn)
        except (KeyError, ValueError):
            pass


def _send_now(sock: socket.socket, data: bytes) -> None:
    try:
        sock.send(data)
    except OSError:
        pass
