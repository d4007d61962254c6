"""The feed folder: written by root (the watcher, the node agents), read by root. On one host
(the local cluster) or a folder every node mounts (a real cluster, docker-slurm's volume).

    <feed_dir>/nodes/<node>.json    NodeFeed, written by the watcher when its content changes
    <feed_dir>/offers/<node>.json   Offers, written by the node's agent when they change
    <feed_dir>/reports/<node>.json  NodeReport, the node's jobs as its agent sees them
    <feed_dir>/events               lines appended by slurmctld's hooks; the watcher wakes on it
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from malleable_protocol import ProtocolError, check_node_name
from malleable_protocol.safe_io import ensure_private_dir, read_bounded, write_atomic

from .model import MAX_FEED_BYTES, NodeFeed, NodeReport, Offers


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


class FeedStore:
    def __init__(self, feed_dir: Path):
        self.feed_dir = Path(feed_dir)
        self._cache: dict[Path, tuple[FeedStamp, object]] = {}

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

    def prepare(self) -> None:
        """Make the folders (root's, nobody else writes there) and the event file."""
        for d in (self.feed_dir, self.nodes_dir, self.offers_dir, self.reports_dir):
            ensure_private_dir(d)
        self.events_file.touch(exist_ok=True)

    # --- writers (root) ----------------------------------------------------------------------

    def write_node(self, feed: NodeFeed) -> None:
        write_atomic(ensure_private_dir(self.nodes_dir), f"{check_node_name(feed.node)}.json", feed.encode())

    def write_offers(self, offers: Offers) -> None:
        write_atomic(ensure_private_dir(self.offers_dir), f"{check_node_name(offers.node)}.json", offers.encode())

    def write_report(self, report: NodeReport) -> None:
        write_atomic(ensure_private_dir(self.reports_dir), f"{check_node_name(report.node)}.json", report.encode())

    def read_report(self, node: str) -> NodeReport | None:
        return self._read(self.reports_dir / f"{check_node_name(node)}.json", NodeReport.decode)

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
        stamp = _stamp(path)
        if stamp is None:
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

    def node_stamp(self, node: str) -> FeedStamp | None:
        return _stamp(self.nodes_dir / f"{check_node_name(node)}.json")

    def events_stamp(self) -> FeedStamp | None:
        return _stamp(self.events_file)
