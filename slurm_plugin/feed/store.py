"""A feed folder: written by root (the watcher, the node agents), read by root. The watcher's
own, local to its host; each node's own, local to it, which the feed link keeps in step with
the watcher's (``link_client.py``); or, without the link, one folder the watcher and every agent
share (one host, or a folder every node mounts). The same layout everywhere:

    <feed_dir>/nodes/<node>.json    NodeFeed, written by the watcher when its content changes
    <feed_dir>/offers/<node>.json   Offers, written by the node's agent when they change
    <feed_dir>/reports/<node>.json  NodeReport, the node's jobs as its agent sees them
    <feed_dir>/events               lines appended by slurmctld's hooks; the watcher wakes on it
    <feed_dir>/usage/<job>.<node>.json  a job's usage on a node, written by the node's Epilog
    <feed_dir>/usage.jsonl          each finished job's usage over its nodes (the watcher's)
    <feed_dir>/agents/<node>.json   the port the node's agent takes feed wakes on (notify.py)

It holds every user's jobs (ids, users, cores), which Slurm's PrivateData=jobs hides from other
users: the folders are root's alone (0700) and the files 0600. ``feed_dir`` itself is 0711:
slurmctld's hooks, which may run as a SlurmUser other than root, reach ``events`` by name
without listing anything; ``events`` keeps the owner the site gave it (SlurmUser) and loses
any access for others. ``malleable status`` is therefore root's (it refuses anyone else).
"""
from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from malleable_protocol import ProtocolError, check_node_name
from malleable_protocol.safe_io import (append_capped, ensure_private_dir, list_bounded, open_dir,
                                        read_bounded, write_atomic)

from slurm_plugin.feed.model import MAX_FEED_BYTES, MAX_SWITCH_REASON, NodeFeed, NodeReport, Offers
from slurm_plugin.feed.usage import MAX_USAGE_BYTES, parse_usage_file_name, usage_file_name

MAX_USAGE_FILES = 100_000           # listed at most (files of jobs the watcher has not closed)
MAX_USAGE_LOG_BYTES = 64 << 20      # usage.jsonl is rotated (usage.jsonl.1) past this


@dataclass(frozen=True)
class FeedStamp:
    """What changes when a file is replaced: checked before a file is read again."""

    mtime_ns: int
    size: int
    inode: int


def _stamp(path: Path) -> FeedStamp | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return FeedStamp(st.st_mtime_ns, st.st_size, st.st_ino)


FEED_DIR_MODE = 0o711     # traversed by SlurmUser to append to events; listed by root only
PRIVATE_DIR_MODE = 0o700
FILE_MODE = 0o600


def _private_dir(path: Path, mode: int = PRIVATE_DIR_MODE) -> Path:
    """A folder of ours that nobody else writes (``ensure_private_dir``), with exactly ``mode``
    (an older version's 0755 folder is narrowed)."""
    ensure_private_dir(path)
    fd = open_dir(path)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return path


class FeedStore:
    """``refresh_s``: a file read (and stat-ed) within that many seconds is answered from
    memory, until ``invalidate()`` (a shared folder's agent, told of changes by wakes: see
    notify.py); None: every read stats the file (a changed one is parsed again)."""

    def __init__(self, feed_dir: Path, *, refresh_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.feed_dir = Path(feed_dir)
        self._cache: dict[Path, tuple[FeedStamp | None, object]] = {}
        self._checked: dict[Path, float] = {}
        self.refresh_s = refresh_s
        self._clock = clock

    def invalidate(self) -> None:
        """The next read of every file looks at the file again."""
        self._checked.clear()

    @property
    def agents_dir(self) -> Path:
        return self.feed_dir / "agents"

    def register_agent(self, node: str, wake_port: int) -> None:
        """The node's agent: where the watcher sends its feed wakes."""
        write_atomic(_private_dir(self.agents_dir), f"{check_node_name(node)}.json",
                     json.dumps({"node": node, "wake_port": wake_port}).encode(), FILE_MODE)

    def agent_wake_port(self, node: str) -> int | None:
        """The port the node's agent registered; None when none did (or the file is bad)."""
        def decode(data: bytes) -> int | None:
            d = json.loads(data)
            port = d.get("wake_port") if isinstance(d, dict) else None
            ok = isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536
            return port if ok and d.get("node") == node else None
        try:
            return self._read(self.agents_dir / f"{check_node_name(node)}.json", decode)
        except ValueError:
            return None

    @property
    def nodes_dir(self) -> Path:
        return self.feed_dir / "nodes"

    @property
    def offers_dir(self) -> Path:
        return self.feed_dir / "offers"

    @property
    def reports_dir(self) -> Path:
        return self.feed_dir / "reports"

    @property
    def events_file(self) -> Path:
        return self.feed_dir / "events"

    @property
    def usage_dir(self) -> Path:
        return self.feed_dir / "usage"

    @property
    def usage_log(self) -> Path:
        return self.feed_dir / "usage.jsonl"

    def prepare(self) -> None:
        """Make the folders (root's, nobody else writes or reads there) and the event file."""
        _private_dir(self.feed_dir, FEED_DIR_MODE)
        for d in (self.nodes_dir, self.offers_dir, self.reports_dir, self.usage_dir):
            _private_dir(d)
        self.prepare_events()

    def prepare_events(self, writer_uid: int | None = None) -> None:
        """The event file: made 0600 if missing; one that exists keeps its owner and group (a
        site gives it to SlurmUser) and loses any access for others. ``writer_uid``: the
        SlurmUser slurmctld's hooks run as (the watcher asks slurmctld), given a root-owned
        file, so they can append to it."""
        fd = os.open(self.events_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW |
                     os.O_NONBLOCK | os.O_CLOEXEC, FILE_MODE)
        try:
            st = os.fstat(fd)
            mode = stat.S_IMODE(st.st_mode)
            if mode & 0o007:
                os.fchmod(fd, mode & 0o770)
            if writer_uid is not None and st.st_uid == 0 and writer_uid != 0:
                os.fchown(fd, writer_uid, -1)
        finally:
            os.close(fd)

    # --- writers (root) ----------------------------------------------------------------------

    def write_node(self, feed: NodeFeed) -> None:
        write_atomic(_private_dir(self.nodes_dir), f"{check_node_name(feed.node)}.json",
                     feed.encode(), FILE_MODE)

    def write_offers(self, offers: Offers) -> None:
        self._write_known(self.offers_dir, offers.node, offers.encode(), offers)

    def write_report(self, report: NodeReport) -> None:
        self._write_known(self.reports_dir, report.node, report.encode(), report)

    def _write_known(self, folder: Path, node: str, data: bytes, value: object) -> None:
        """A file this process writes and reads back: what it wrote is what a read within
        ``refresh_s`` answers (its own writes need no stat to be known)."""
        path = folder / f"{check_node_name(node)}.json"
        write_atomic(_private_dir(folder), path.name, data, FILE_MODE)
        stamp = _stamp(path)
        if stamp is not None:
            self._cache[path] = (stamp, value)
            self._checked[path] = self._clock()

    def write_usage(self, job_id: int, node: str, line: bytes) -> None:
        """A node's Epilog: the job's usage on ``node`` (one JSON line)."""
        if len(line) > MAX_USAGE_BYTES:
            raise ValueError(f"a usage line of {len(line)} bytes")
        write_atomic(_private_dir(self.usage_dir), usage_file_name(job_id, node), line,
                     FILE_MODE)

    def usage_files(self) -> dict[int, list[str]]:
        """Job id -> the names of its nodes' usage files (bounded listing; other names skipped)."""
        try:
            fd = open_dir(self.usage_dir)
        except FileNotFoundError:
            return {}
        try:
            names = list_bounded(fd, MAX_USAGE_FILES)
        finally:
            os.close(fd)
        out: dict[int, list[str]] = {}
        for name in sorted(names):
            parsed = parse_usage_file_name(name)
            if parsed is not None:
                out.setdefault(parsed[0], []).append(name)
        return out

    def read_usage(self, name: str) -> bytes:
        """One usage file's bytes (no link followed, at most a few KiB)."""
        if parse_usage_file_name(name) is None:
            raise ValueError(f"not a usage file name: {name!r:.40}")
        return read_bounded(self.usage_dir / name, MAX_USAGE_BYTES)

    def remove_usage(self, name: str) -> None:
        if parse_usage_file_name(name) is None:
            raise ValueError(f"not a usage file name: {name!r:.40}")
        try:
            os.unlink(self.usage_dir / name)
        except FileNotFoundError:
            pass

    # --- the site's kill switch (``malleable disable --site``): the watcher puts it in every
    # node's feed at its next poll, which the line the command appends to the event file
    # starts at once.

    @property
    def site_switch_file(self) -> Path:
        return self.feed_dir / "switched-off"

    def switch_site_off(self, reason: str) -> None:
        write_atomic(_private_dir(self.feed_dir, FEED_DIR_MODE), self.site_switch_file.name,
                     reason.encode()[:MAX_SWITCH_REASON - 64] + b"\n", FILE_MODE)
        self._tell_watcher("site-switch")

    def switch_site_on(self) -> bool:
        """False when it was not switched off."""
        try:
            os.unlink(self.site_switch_file)
        except FileNotFoundError:
            return False
        self._tell_watcher("site-switch")
        return True

    def site_switched_off(self) -> str | None:
        """Why the site switched malleability off, or None. A file that cannot be read counts
        as thrown: off is always safe."""
        try:
            raw = read_bounded(self.site_switch_file, MAX_SWITCH_REASON)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"switched off for the site ({self.site_switch_file}: {exc.strerror or exc})"
        reason = raw.decode(errors="replace").strip()
        return "switched off for the site by 'malleable disable --site'" + \
            (f": {reason}" if reason else "")

    @property
    def polled_file(self) -> Path:
        return self.feed_dir / "polled"

    def write_polled(self, at: float) -> None:
        """The watcher's: the wall time its latest published poll began (``node.quiet``)."""
        write_atomic(_private_dir(self.feed_dir, FEED_DIR_MODE), self.polled_file.name,
                     f"{at!r}\n".encode(), FILE_MODE)

    def polled_at(self) -> float | None:
        try:
            return float(read_bounded(self.polled_file, 64))
        except (OSError, ValueError):
            return None

    def poke_watcher(self) -> None:
        """Ask the watcher for a poll now (a line in its event file); never raises."""
        try:
            self._tell_watcher("poke")
        except OSError:
            pass

    def _tell_watcher(self, what: str) -> None:
        try:
            fd = os.open(self.events_file, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW |
                         os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return           # no watcher has made it yet: its first poll reads the switch
        try:
            os.write(fd, f"{int(time.time())} {what} 0\n".encode())
        finally:
            os.close(fd)

    def log_usage(self, line: str) -> None:
        append_capped(self.usage_log, line + "\n", MAX_USAGE_LOG_BYTES)

    def read_report(self, node: str) -> NodeReport | None:
        return self._read(self.reports_dir / f"{check_node_name(node)}.json", NodeReport.decode)

    def check_readable(self) -> None:
        """Raises ``PermissionError`` when this process may not read the feed (anyone but root,
        see the module's docstring); a feed not made yet is no error."""
        try:
            names = sorted(n for n in os.listdir(self.nodes_dir) if n.endswith(".json"))
        except FileNotFoundError:
            return
        try:
            if names:
                read_bounded(self.nodes_dir / names[0], MAX_FEED_BYTES)
        except PermissionError:
            raise
        except OSError:
            pass       # replaced meanwhile, or bad: the readers say so

    def node_names(self) -> list[str]:
        """The nodes the watcher has published."""
        try:
            return sorted(n[:-5] for n in os.listdir(self.nodes_dir) if n.endswith(".json"))
        except OSError:
            return []

    def remove_node(self, node: str) -> None:
        try:
            os.unlink(self.nodes_dir / f"{check_node_name(node)}.json")
        except FileNotFoundError:
            pass

    # --- readers ---------------------------------------------------------------------------

    def _read(self, path: Path, decode):
        if self.refresh_s is not None and path in self._cache and \
                self._clock() - self._checked.get(path, float("-inf")) < self.refresh_s:
            return self._cache[path][1]
        self._checked[path] = self._clock()
        stamp = _stamp(path)
        if stamp is None:
            self._cache[path] = (None, None)     # a missing file is known missing, as long
            return None
        hit = self._cache.get(path)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        try:
            value = decode(read_bounded(path, MAX_FEED_BYTES))
        except FileNotFoundError:
            return None
        except (OSError, ProtocolError):
            value = None
        self._cache[path] = (stamp, value)
        return value

    def read_node(self, node: str) -> NodeFeed | None:
        return self._read(self.nodes_dir / f"{check_node_name(node)}.json", NodeFeed.decode)

    def read_offers(self, node: str) -> Offers | None:
        return self._read(self.offers_dir / f"{check_node_name(node)}.json", Offers.decode)

    def node_changed(self, node: str, since: FeedStamp | None) -> tuple[bool, FeedStamp | None]:
        """Whether the node's feed file differs from ``since``: answered from memory within
        ``refresh_s`` of the last look (False then); a change invalidates every cached read."""
        path = self.nodes_dir / f"{check_node_name(node)}.json"
        key = path.with_name(path.name + ".stamp")
        if self.refresh_s is not None and \
                self._clock() - self._checked.get(key, float("-inf")) < self.refresh_s:
            return False, since
        self._checked[key] = self._clock()
        now = _stamp(path)
        if now != since:
            self.invalidate()
            self._checked[key] = self._clock()
            return True, now
        return False, now

    def node_stamp(self, node: str) -> FeedStamp | None:
        return _stamp(self.nodes_dir / f"{check_node_name(node)}.json")

    def events_stamp(self) -> FeedStamp | None:
        return _stamp(self.events_file)
