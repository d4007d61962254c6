"""How a node's agent learns that its feed changed without polling a shared file system.

The feed folder is local to the agent (one host: the local cluster, a site's single-host test)
or shared (NFS and the like: every node mounts the watcher's folder). Polling a shared folder
costs the site's file server a metadata operation per stat: 20 a second per node at a 50 ms
check, 20,000 a second on 1,000 nodes. So:

- local (``FeedMode.LOCAL``): the kernel tells (inotify on the folders the agent reads); no stat;
- shared (``FeedMode.SHARED``): the watcher pushes a wake datagram to the node's agent (UDP, to
  the node's NodeAddr and the port the agent registered in the feed) after it writes that node's
  feed, and the agent stats the feed at most every ``shared_refresh_s`` as a fallback.

A wake carries no data: it only makes the agent look at the feed it would have read anyway, so
a forged one costs a cycle (at most one per ``WAKE_MIN_GAP_S``) and changes nothing.
``feed_mode_of`` decides from the file system type of the folder's mount; an unknown type is
treated as shared (slow polling is safe everywhere, inotify is not: it misses other hosts'
writes on NFS).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import enum
import errno
import logging
import os
import select
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from malleable_protocol import check_node_name
from malleable_protocol.cgroupfs import parse_mountinfo

log = logging.getLogger(__name__)

WAKE_MIN_GAP_S = 0.05          # wakes closer than this are one
MAX_WAKE_BYTES = 128
# File systems whose changes inotify sees: those of this kernel alone.
LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "overlay",
                      "f2fs", "zfs", "jfs", "reiserfs", "bcachefs"})


class FeedMode(enum.Enum):
    AUTO = "auto"
    LOCAL = "local"
    SHARED = "shared"


def fs_type_of(path: str, mountinfo: str) -> str:
    """The file system type of the mount holding ``path`` (absolute, resolved): the mount
    whose point is the longest prefix of it (the last listed of those on one point: it hides
    the others); "" when none matches. Pure."""
    best, fstype = -1, ""
    for m in parse_mountinfo(mountinfo):
        point = m.point.rstrip("/") or "/"
        inside = point == "/" or path == point or path.startswith(point + "/")
        if inside and len(point) >= best:
            best, fstype = len(point), m.fstype
    return fstype


def feed_mode_of(fstype: str) -> FeedMode:
    """LOCAL for a file system of this kernel alone, SHARED for anything else (NFS, CIFS,
    Lustre, GPFS, BeeGFS, CephFS, FUSE, and any type not known here). Pure."""
    return FeedMode.LOCAL if fstype in LOCAL_FS else FeedMode.SHARED


def discover_feed_mode(feed_dir: Path) -> tuple[FeedMode, str]:
    """(the mode for ``feed_dir``, its file system type)."""
    with open("/proc/self/mountinfo") as f:
        fstype = fs_type_of(os.path.realpath(feed_dir), f.read())
    return feed_mode_of(fstype), fstype


# --- wake datagrams -----------------------------------------------------------------------

def encode_wake(node: str) -> bytes:
    return f"feed {check_node_name(node)}\n".encode()


def is_wake_for(data: bytes, node: str) -> bool:
    """Whether ``data`` is a wake for ``node`` (anything else is dropped). Pure."""
    return len(data) <= MAX_WAKE_BYTES and data == encode_wake(node)


def send_wake(address: str, port: int, node: str) -> None:
    """One datagram; never raises for an unreachable node (the agent's fallback poll
    catches up)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(encode_wake(node), (address, port))
    except OSError as exc:
        log.debug("wake for %s at %s:%d not sent: %s", node, address, port, exc)


class WakeListener:
    """The agent's UDP wake port: ``on_wake()`` for each wake naming this node (at most one
    per ``WAKE_MIN_GAP_S``). ``start()`` binds and starts its thread; nothing in the
    constructor."""

    def __init__(self, node: str, port: int, on_wake: Callable[[], None], *,
                 address: str = "0.0.0.0", clock: Callable[[], float] = time.monotonic):
        self.node, self.port, self.address = check_node_name(node), port, address
        self._on_wake, self._clock = on_wake, clock
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.wakes = 0                 # accepted
        self.dropped = 0               # not a wake for this node

    def start(self) -> int:
        """Binds (port 0: any free one) and returns the port bound."""
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((self.address, self.port))
        self._sock.settimeout(0.5)
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="feed-wake", daemon=True)
        self._thread.start()
        return self.port

    def _serve(self) -> None:
        last = float("-inf")
        while not self._stop.is_set():
            try:
                data, _ = self._sock.recvfrom(MAX_WAKE_BYTES + 1)
            except socket.timeout:
                continue
            except OSError:
                return
            if not is_wake_for(data, self.node):
                self.dropped += 1
                continue
            now = self._clock()
            if now - last >= WAKE_MIN_GAP_S:
                last = now
                self.wakes += 1
                self._on_wake()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        if self._sock is not None:
            self._sock.close()


# --- inotify (local folders) ----------------------------------------------------------------

_IN_CLOSE_WRITE, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x8, 0x80, 0x100, 0x200
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")


class InotifyWatch:
    """Folders watched for files written into place (write then rename, as the feed's writers
    do): ``on_change(names)`` from a thread of its own. ``start()`` begins; nothing in the
    constructor."""

    def __init__(self, folders: Iterable[Path], on_change: Callable[[set[str]], None]):
        self.folders = [Path(f) for f in folders]
        self._on_change = on_change
        self._fd = -1
        self._stop_r, self._stop_w = -1, -1
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._fd = fd
        mask = _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
        for folder in self.folders:
            if libc.inotify_add_watch(fd, os.fsencode(folder), mask) < 0:
                err = ctypes.get_errno()
                os.close(fd)
                raise OSError(err, f"inotify_add_watch {folder}: {os.strerror(err)}")
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="feed-inotify", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            ready, _, _ = select.select([self._fd, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            try:
                data = os.read(self._fd, 64 * 1024)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    continue
                return
            names, pos = set(), 0
            while pos + _EVENT.size <= len(data):
                _, _, _, length = _EVENT.unpack_from(data, pos)
                raw = data[pos + _EVENT.size:pos + _EVENT.size + length]
                names.add(raw.split(b"\0", 1)[0].decode(errors="replace"))
                pos += _EVENT.size + length
            if names:
                self._on_change(names)

    def stop(self) -> None:
        if self._stop_w >= 0:
            os.write(self._stop_w, b"x")
        if self._thread is not None:
            self._thread.join(2)
        for fd in (self._fd, self._stop_r, self._stop_w):
            if fd >= 0:
                os.close(fd)
        self._fd = self._stop_r = self._stop_w = -1
