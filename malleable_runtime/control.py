"""Control intake: what the runtime is told to do, and the thread that listens for it.

Control signals (mapped to ``Action``s; the native handler writes the action's code to a pipe),
the co-scheduler's target file (a ``malleable_protocol.Target``), and the watcher thread that
reads the signal pipe and, when nothing arrives for a while, asks for a reload anyway.
"""
from __future__ import annotations

import enum
import logging
import os
import re
import select
import signal
import threading
from pathlib import Path
from typing import Callable, Mapping

from malleable_protocol import ProtocolError, Target, is_reload_signal
from malleable_protocol.records import MAX_RECORD_BYTES
from malleable_protocol.safe_io import read_bounded

log = logging.getLogger(__name__)


class Action(enum.Enum):
    """What a control signal asks for."""

    RELOAD = 1       # re-read the allowance and the target file
    INTRA_UP = 2
    INTRA_DOWN = 3
    INTER_UP = 4
    INTER_DOWN = 5
    ALLOWANCE = 6    # re-read the allowance only (what the native poller sends on a change)


# The default "look again" signal is a real-time one: SIGUSR1 and SIGUSR2 belong to the job's
# own scripts (``sbatch --signal=B:USR1@60`` is the common "checkpoint now" idiom). RTMIN+3, not
# RTMIN: the first few are the ones a program that wants "a real-time signal" takes (POSIX timer
# examples; LinuxThreads took +0..+2). Python's SIGRTMIN is the C library's, past the ones
# glibc keeps for itself. Its default action ends the process: the runtime ignores it from
# import, and its status record names it only once the handler is in (the agent sends a rank
# only the signal its record names).
DEFAULT_RELOAD_SIGNAL = int(signal.SIGRTMIN) + 3
DEFAULT_SIGNALS: dict[int, Action] = {DEFAULT_RELOAD_SIGNAL: Action.RELOAD}

_RT_NAME = re.compile(r"RT(MIN|MAX)(?:([+-])([0-9]{1,2}))?")
_ACTION_NAMES = ", ".join(a.name.lower().replace("_", "-") for a in Action)


def signal_name(signo: int) -> str:
    """"SIGUSR1", "SIGRTMIN+3": the name a signal spec takes."""
    try:
        return signal.Signals(signo).name
    except ValueError:
        if signal.SIGRTMIN < signo < signal.SIGRTMAX:
            return f"SIGRTMIN+{signo - signal.SIGRTMIN}"
        return str(signo)


def parse_signal_name(text: str) -> int:
    """ "USR1", "SIGUSR2", "RTMIN+3", "SIGRTMAX-1" (kill -l's names) -> the signal's number.
    Names, not numbers: RTMIN+3 is 37 under glibc, 38 under musl."""
    name = text.strip().upper().removeprefix("SIG")
    rt = _RT_NAME.fullmatch(name)
    if rt:
        base, sign, offset = rt.groups()
        if sign == ("-" if base == "MIN" else "+"):
            raise ValueError(f"{text.strip()!r}: RTMIN+n or RTMAX-n")
        signo = signal.SIGRTMIN + int(offset or 0) if base == "MIN" else \
            signal.SIGRTMAX - int(offset or 0)
        if not signal.SIGRTMIN <= signo <= signal.SIGRTMAX:
            raise ValueError(f"{text.strip()!r}: the real-time signals are RTMIN+0.."
                             f"RTMIN+{signal.SIGRTMAX - signal.SIGRTMIN}")
        return int(signo)
    try:
        signo = signal.Signals["SIG" + name]
    except KeyError:
        raise ValueError(f"{text.strip()!r:.32} is not a signal (USR1, USR2, RTMIN+3...)") from None
    if signo in (signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGBUS):
        raise ValueError(f"{signo.name} cannot be a control signal")
    return int(signo)


def parse_signal_spec(text: str) -> dict[int, Action]:
    """ "RTMIN+3=reload,USR2=intra-down" -> {SIGRTMIN+3: RELOAD, SIGUSR2: INTRA_DOWN}."""
    out: dict[int, Action] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, action = item.partition("=")
        if not sep:
            raise ValueError(f"bad signal mapping {item!r:.40}: want NAME=action")
        try:
            signo = parse_signal_name(name)
        except ValueError as exc:
            raise ValueError(f"bad signal mapping {item!r:.40}: {exc}") from None
        try:
            act = Action[action.strip().upper().replace("-", "_")]
        except KeyError:
            raise ValueError(f"bad signal mapping {item!r:.40}: the actions are "
                             f"{_ACTION_NAMES}") from None
        out[signo] = act
    return out


def announced_reload_signal(mapping: Mapping[int, Action]) -> int | None:
    """The signal a status record names as this rank's "look again": the first mapped to RELOAD
    that the agent may send (``malleable_protocol.is_reload_signal``). None: the agent sends
    none, and the target is re-read once a second all the same."""
    return next((int(signo) for signo, action in mapping.items()
                 if action is Action.RELOAD and is_reload_signal(int(signo))), None)


def load_target(path: Path) -> Target | None:
    """Read the co-scheduler's Target (bounded, no links followed). None when there is nothing
    to take: a missing file silently, a bad one reported."""
    try:
        return Target.decode(read_bounded(path, MAX_RECORD_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, ProtocolError) as exc:
        log.warning("malleable: ignoring target file %s: %s", path, exc)
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
            except Exception as exc:  # noqa: BLE001 - the watcher must outlive any one bad event
                log.warning("malleable: watcher: %s", exc)


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
