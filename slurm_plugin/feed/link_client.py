"""The agent's end of the feed link (``link.py``): a thread that keeps one connection to the
watcher (the hosts tried in order: the controller, then its backups) and mirrors the feed
between the watcher and the node's own local feed folder.

Down: the node's feed, its peers' offers and the watcher's poll time are written into the local
folder, as a watcher on this host would write them; the agent's inotify sees them at once.
Up: whatever the agent and the hooks write there for the watcher (the node's offers and report,
usage files, pokes appended to the event file) is sent when the folder changes, and again
after every reconnect; a usage file is removed once the watcher has acknowledged it.

Everything on the node (the agent's cycle, the Prolog, the Epilog, the step start) reads and
writes only that local folder: a watcher or a network that hangs leaves the node working on its
last feed, and never holds up a job's launch.
"""
from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from typing import Callable, Sequence

from malleable_protocol import ProtocolError
from malleable_protocol.safe_io import read_bounded

from slurm_plugin.feed.link import (ClientHandshake, FrameReader, LinkAuth, LinkError,
                                    MAX_HANDSHAKE_BYTES, Session, keepalive, message_data)
from slurm_plugin.feed.model import MAX_FEED_BYTES, NodeFeed, Offers
from slurm_plugin.feed.notify import InotifyWatch
from slurm_plugin.feed.store import FeedStore
from slurm_plugin.feed.usage import MAX_USAGE_BYTES, usage_file_name

log = logging.getLogger(__name__)

PING_S = 20.0               # a frame at least this often, so a dead watcher is noticed
MAX_USAGE_PER_TURN = 64


class LinkClient:
    def __init__(self, node: str, hosts: Sequence[str], port: int, auth: LinkAuth,
                 store: FeedStore, *, connect_timeout_s: float = 5.0, retry_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        if not hosts:
            raise ValueError("no watcher host for the feed link")
        self.node, self.hosts, self.port, self.auth = node, list(hosts), port, auth
        self.store = store
        self.connect_timeout_s, self.retry_s = connect_timeout_s, retry_s
        self._clock = clock
        self.connected_to: str | None = None
        self.connects = 0
        self.synced = threading.Event()    # the node's feed came down since the last connect
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._thread: threading.Thread | None = None
        self._watch: InotifyWatch | None = None

    def start(self) -> None:
        self.store.prepare()
        self._watch = InotifyWatch([self.store.feed_dir, self.store.offers_dir,
                                    self.store.reports_dir, self.store.usage_dir],
                                   lambda _names: self._poke_thread())
        self._watch.start()
        self._thread = threading.Thread(target=self._run, name="feed-link", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._poke_thread()
        if self._thread is not None:
            self._thread.join(5)
        if self._watch is not None:
            self._watch.stop()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    def _poke_thread(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _run(self) -> None:
        while not self._stop.is_set():
            for host in self.hosts:
                if self._stop.is_set():
                    return
                try:
                    sock, session, first = self._connect(host)
                except (OSError, LinkError) as exc:
                    log.warning("feed link to %s:%d: %s", host, self.port, exc)
                    continue
                self.connected_to, self.connects = host, self.connects + 1
                self.synced.clear()
                log.info("feed link to %s:%d open", host, self.port)
                try:
                    _Stream(self, sock, session).serve(first)
                except (OSError, LinkError) as exc:
                    log.warning("feed link to %s:%d lost: %s", host, self.port, exc)
                finally:
                    self.connected_to = None
                    sock.close()
                break            # start again from the first host
            self._stop.wait(self.retry_s)

    def _connect(self, host: str) -> tuple[socket.socket, Session, bytes]:
        """An open, authenticated connection, and the bytes the watcher sent behind its
        handshake (the node's feed, often in the same packet)."""
        sock = socket.create_connection((host, self.port), timeout=self.connect_timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keepalive(sock)
            hand = ClientHandshake(self.node, self.auth)
            sock.sendall(hand.hello())
            reader = FrameReader(MAX_HANDSHAKE_BYTES)
            while True:
                data = sock.recv(4096)
                if not data:
                    raise LinkError("the watcher closed the connection (not the active one?)")
                body = next(reader.feed(data), None)
                if body is not None:
                    session = hand.finish(body)
                    break
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return sock, session, reader.take_rest()


class _Stream:
    """One open connection: what goes down is written locally, what changed locally goes up."""

    def __init__(self, client: LinkClient, sock: socket.socket, session: Session):
        self.c, self.sock, self.session = client, sock, session
        self.store = client.store
        self.reader = FrameReader()
        self.sent: dict[str, bytes] = {}
        self.usage_in_flight: set[str] = set()
        self.events_size = self._events_size()
        self.last_out = client._clock()

    def serve(self, first: bytes) -> None:
        self._send_local()
        for body in self.reader.feed(first):
            self._take(self.session.open(body))
        while not self.c._stop.is_set():
            ready, _, _ = select.select([self.sock, self.c._wake_r], [], [], PING_S / 2)
            if self.c._wake_r in ready:
                try:
                    while os.read(self.c._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                self._send_local()
            if self.sock in ready:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise LinkError("closed by the watcher")
                for body in self.reader.feed(data):
                    self._take(self.session.open(body))
            if self.c._clock() - self.last_out >= PING_S:
                self._send({"t": "ping"})

    def _send(self, message: dict) -> None:
        self.sock.sendall(self.session.seal(message))
        self.last_out = self.c._clock()

    def _events_size(self) -> int:
        try:
            return os.stat(self.store.events_file).st_size
        except OSError:
            return 0

    def _send_local(self) -> None:
        """What the node wrote for the watcher since the last look."""
        node = self.c.node
        for kind, path in (("offers", self.store.offers_dir / f"{node}.json"),
                           ("report", self.store.reports_dir / f"{node}.json")):
            try:
                data = read_bounded(path, MAX_FEED_BYTES)
            except FileNotFoundError:
                continue
            if self.sent.get(kind) != data:
                self.sent[kind] = data
                self._send({"t": kind, "data": data.decode(errors="replace")})
        for name in self._usage_names():
            try:
                data = read_bounded(self.store.usage_dir / name, MAX_USAGE_BYTES)
            except OSError:
                continue
            self.usage_in_flight.add(name)
            self._send({"t": "usage", "name": name, "data": data.decode(errors="replace")})
        size = self._events_size()
        if size != self.events_size:
            self.events_size = size
            self._send({"t": "poke"})

    def _usage_names(self) -> list[str]:
        """This node's usage files not sent yet (the store's bounded listing)."""
        mine = sorted(n for job_id, names in self.store.usage_files().items() for n in names
                      if n not in self.usage_in_flight and n == usage_file_name(job_id,
                                                                                self.c.node))
        return mine[:MAX_USAGE_PER_TURN]

    def _take(self, m: dict) -> None:
        kind = m["t"]
        try:
            if kind == "node":
                feed = NodeFeed.decode(message_data(m))
                if feed.node != self.c.node:
                    raise LinkError(f"the feed of {feed.node}, not of {self.c.node}")
                self.store.write_node(feed)
                self.c.synced.set()
            elif kind == "offers":
                self.store.write_offers(Offers.decode(message_data(m)))
            elif kind == "polled":
                at = m.get("at")
                if isinstance(at, bool) or not isinstance(at, (int, float)):
                    raise LinkError("a bad poll time")
                self.store.write_polled(float(at))
            elif kind == "ack":
                name = m.get("name")
                if isinstance(name, str) and name in self.usage_in_flight:
                    self.usage_in_flight.discard(name)
                    self.store.remove_usage(name)
                    self._send_local()      # the next ones, if any were held back
            else:
                raise LinkError(f"an unknown message {str(kind)[:20]!r}")
        except ProtocolError as exc:
            raise LinkError(str(exc)) from None


