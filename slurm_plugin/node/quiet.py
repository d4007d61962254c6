"""A quiet node: no malleable job on it and every job on exactly its allocation, so the Prolog
of a job that did not ask for malleability has nothing to do there and exits in its shell,
without starting Python (``prolog.sh``: about 90 ms of imports and a cycle under the node's
lock otherwise, for every job that starts).

Two files in the node's state folder (root's alone), written only under the node's lock:

- ``quiet-<node>`` (``AgentConfig.quiet_file``): the node is quiet. The Prolog's shell reads
  it, and skips Python for a job whose environment does not hint at malleability.
- ``loud-<node>`` (``AgentConfig.loud_file``): the wall time the node stopped being quiet. A job
  whose Prolog was skipped left no starting mark in the ledger: until its cgroup folder is
  made, only Slurm's feed shows its cores. Slurm allocated it before its Prolog read the quiet
  file, so any watcher poll after the node stopped being quiet lists it. Until the watcher has
  published such a poll (``FeedStore.polled_at``), no core is lent on the node (``gate``); the
  agent tells the watcher to poll (its event file), and again, less and less often, until
  such a poll comes. The margin covers the controller's clock against the node's.

Nothing else changes: a node that is not quiet runs every hook as before.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from malleable_policy.model import NodeSnapshot
from malleable_protocol.safe_io import write_atomic
from slurm_plugin.node.ledger import Ledger

QUIET_SKEW_S = 1.0        # the controller's clock may be this far behind the node's
RETELL_S = 2.0            # the least time between two tells while the gate waits


def quiet_possible(snapshot: NodeSnapshot, ledger: Ledger, feed_malleable: bool) -> bool:
    """Whether nothing on the node may borrow or lend: no malleable job in the node's feed or
    among the jobs seen, no job starting (a Prolog's mark), nothing unverified. Fences do not
    count: the SPANK plugin fences every step of a job on its allocation, rigid ones too, and
    they keep a job where a quiet node holds every job anyway."""
    return not (feed_malleable or ledger.starting or snapshot.problems
                or any(j.spec is not None for j in snapshot.jobs))


def _write(path: Path, text: str) -> None:
    write_atomic(path.parent, path.name, text.encode(), 0o600)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _loud_since(loud: Path) -> tuple[float, float | None] | None:
    """The loud file's time and when the watcher was last told after the margin (None: not
    yet)."""
    try:
        with open(loud, "rb") as f:
            fields = f.read(64).split()
        return float(fields[0]), float(fields[1]) if len(fields) > 1 else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, IndexError):
        return 0.0, None      # unreadable: no lending until a poll after the epoch: any poll


def break_quiet(quiet: Path, loud: Path, now: float, tell_watcher: Callable[[], None]) -> bool:
    """The node is no longer quiet (a malleable job, a start, an unverified job): the time is written
    before the quiet file goes, and the watcher is told to poll. True when it was quiet."""
    if not quiet.exists():
        return False
    _write(loud, f"{now!r}\n")
    _unlink(quiet)
    tell_watcher()
    return True


def make_quiet(quiet: Path, loud: Path) -> None:
    """The node is quiet (nothing malleable, every job on its allocation): Prologs may skip."""
    if not quiet.exists():
        _write(quiet, "")
    _unlink(loud)


def gate(loud: Path, polled_at: Callable[[], float | None], now: float,
         tell_watcher: Callable[[], None]) -> str | None:
    """Why no core may be lent on the node yet, or None. Open once the watcher has published
    a poll made ``QUIET_SKEW_S`` after the node stopped being quiet (the loud file is then
    removed: open until the node is quiet again)."""
    since = _loud_since(loud)
    if since is None:
        return None
    at, told = since
    polled = polled_at()
    if polled is not None and polled >= at + QUIET_SKEW_S:
        _unlink(loud)
        return None
    # Told again after the margin, and again while no such poll comes: the watcher answers a
    # tell with the time its next poll began, by its host's clock, which may be behind this
    # one's (seen: 0.12 s short, and the node never lent again). Less and less often, so a
    # clock far behind costs slurmctld a poll at 1, 3, 6, 12, ... s, not one every cycle.
    if now >= at + QUIET_SKEW_S and (told is None or now >= told + max(RETELL_S, told - at)):
        _write(loud, f"{at!r} {now!r}\n")
        tell_watcher()          # a poll after the margin
    return ("the node was quiet until just now (jobs may have started without a Prolog): "
            "nothing is lent until the watcher publishes a poll made after that")
