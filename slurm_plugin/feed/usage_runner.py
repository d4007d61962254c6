"""Where the watcher closes ended jobs' usage: beside its polls, not in them.

Closing a job's usage calls slurmdbd (sacct, sacctmgr). A database that is slow or gone makes
each call wait for its timeout, and a poll that waited for them would publish no feed for as
long: every agent's view of the cluster would go stale. ``BackgroundUsage`` runs the closing in
a thread of its own, one at a time; a poll hands it the jobs it read and takes what was closed
since. While a closing runs, a newer hand-over waits in its place (the latest jobs only: the
usage files stay until closed, so nothing is lost by skipping a list). ``InlineUsage`` closes
at once, in the poll (``--once``, and the unit tests of the closing itself)."""
from __future__ import annotations

import logging
import threading
from typing import Callable, Protocol

log = logging.getLogger(__name__)

Closing = Callable[[], list[int]]      # closes what it can; returns the job ids closed


class UsageRunner(Protocol):
    def hand(self, closing: Closing) -> None: ...
    def closed(self) -> list[int]: ...


class InlineUsage:
    """Closes in the caller's thread."""

    def __init__(self) -> None:
        self._closed: list[int] = []

    def hand(self, closing: Closing) -> None:
        self._closed += closing()

    def closed(self) -> list[int]:
        out, self._closed = self._closed, []
        return out


class BackgroundUsage:
    """Closes in one daemon thread, the latest hand-over only; never blocks the caller."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: Closing | None = None
        self._running = False
        self._closed: list[int] = []
        self.idle = threading.Event()      # set while no closing runs or waits
        self.idle.set()

    def hand(self, closing: Closing) -> None:
        with self._lock:
            self._waiting = closing
            self.idle.clear()
            if self._running:
                return
            self._running = True
        threading.Thread(target=self._work, name="usage-closing", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._lock:
                closing, self._waiting = self._waiting, None
                if closing is None:
                    self._running = False
                    self.idle.set()
                    return
            try:
                done = closing()
            except Exception:      # noqa: BLE001 - a bug here must not end the closing thread
                log.exception("closing ended jobs' usage failed")
                done = []
            with self._lock:
                self._closed += done

    def closed(self) -> list[int]:
        with self._lock:
            out, self._closed = self._closed, []
        return out
