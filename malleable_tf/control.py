"""Control intake: what the runtime is told to do, and the thread that listens for it.

Control signals (mapped to ``Action``s; the native handler writes the action's code to a pipe),
the co-scheduler's target file (a ``malleable_protocol.Target``), and the watcher thread that
reads the signal pipe and, when nothing arrives for a while, asks for a reload anyway.
"""
from __future__ import annotations

import enum
import logging
import os
import select
import signal
import threading
from pathlib import Path
from typing import Callable

from malleable_protocol import ProtocolError, Target
from malleable_protocol.records import MAX_RECORD_BYTES
from malleable_protocol.safe_io import read_bounded

log = logging.getLogger("malleable_tf")


class Action(enum.Enum):
    """What a control signal asks for."""

    RELOAD = 1       # re-read the allowance and the target file
    INTRA_UP = 2
    INTRA_DOWN = 3
    INTER_UP = 4
    INTER_DOWN = 5
    ALLOWANCE = 6    # re-read the allowance only (what the native poller sends on a change)


DEFAULT_SIGNALS: dict[int, Action] = {signal.SIGUSR1: Action.RELOAD}


def parse_signal_spec(text: str) -> dict[int, Action]:
    """ "USR1=reload,USR2=intra-down" -> {SIGUSR1: RELOAD, SIGUSR2: INTRA_DOWN}."""
    out: dict[int, Action] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, action = item.partition("=")
        if not sep:
            raise ValueError(f"bad signal mapping {item!r}: want NAME=action")
        name = name.strip().upper()
        try:
            signo = signal.Signals[name if name.startswith("SIG") else "SIG" + name]
            act = Action[action.strip().upper().replace("-", "_")]
        except KeyError as exc:
            raise ValueError(f"bad signal mapping {item!r}") from exc
        if signo in (signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGBUS):
            raise ValueError(f"{signo.name} cannot be a control signal")
        out[int(signo)] = act
    return out


def load_target(path: Path) -> Target | None:
    """Read the co-scheduler's Target (bounded, no links followed). None when there is nothing
    to take: a missing file silently, a bad one reported."""
    try:
        return Target.decode(read_bounded(path, MAX_RECORD_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, ProtocolError) as exc:
        log.warning("malleable_tf: ignoring target file %s: %s", path, exc)
        return None


class Watcher:
    """The thread that turns control signals into calls: every action read from ``signal_fd``
    goes to ``on_action``; a wait of ``interval_s`` with nothing read counts as a RELOAD (the
    safety net: a missed signal, a moved cgroup). After each wake, ``after_wake(timed_out)``.
    The thread starts in ``start``, never in the constructor."""

    def __init__(self, signal_fd: int, interval_s: float, on_action: Callable[[Action], None],
                 after_wake: Callable[[bool], None]):
        self.signal_fd = signal_fd
        self.interval_s = interval_s
        self._on_action = on_action
        self._after_wake = after_wake
        self._stop_r, self._stop_w = os.pipe()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="malleable-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        sig_fd = self.signal_fd
        while True:
            ready, _, _ = select.select([sig_fd, self._stop_r], [], [], self.interval_s)
            if self._stop_r in ready:
                return
            try:
                if sig_fd in ready:
                    for code in _drain(sig_fd):
                        try:
                            self._on_action(Action(code))
                        except ValueError:
                            continue
                if not ready:   # the once-a-second safety net: a missed signal, a moved cgroup
                    self._on_action(Action.RELOAD)
                self._after_wake(not ready)
            except Exception as exc:  # the watcher must outlive any one bad event
                log.warning("malleable_tf: watcher: %s", exc)


def _drain(fd: int) -> bytes:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk
