"""Wake-ups without a native library (``adapter.Wakeups``): for a framework whose threads are
resized from Python (PyTorch), so that no compiler is needed on a compute node.

- Signals: a Python handler, which runs in the main thread between two bytecodes, writes the
  action's code to a pipe the watcher reads. Python installs handlers from the main thread only;
  ``install_signal`` elsewhere returns -EINVAL. ``signal.siginterrupt(signo, False)`` keeps the
  native libraries' system calls (gloo's, OpenMP's) from failing with EINTR when one arrives.
  ``on_main_thread`` runs in that handler first: the adapter applies there what must be applied
  in the thread that runs the ops (``torch.set_num_threads`` is per thread), and
  ``wake_main_thread`` makes the handler run without a real signal (``_thread.interrupt_main``).
- The poll: a daemon thread compares the affinity mask and the watched files' bytes every
  ``interval`` and writes the action's code on a change. Each poll holds the GIL for a few
  file reads (measured by ``benchmarks/torch_fidelity.py`` as part of the runtime's cost), so
  its interval is longer than the native poller's (``malleable_torch.init``: 20 ms).
"""
from __future__ import annotations

import _thread
import errno
import logging
import os
import signal
import threading
from typing import Callable, cast

log = logging.getLogger(__name__)


class PythonWakeups:
    def __init__(self, on_main_thread: Callable[[], None] | None = None) -> None:
        # Runs in the main thread at each signal and wake, before the action goes to the watcher.
        self.on_main_thread = on_main_thread
        self._read_fd, self._write_fd = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self._write_fd, False)   # a full pipe drops a byte; a poll follows anyway
        os.set_blocking(self._read_fd, False)    # the watcher drains it until EAGAIN
        self._codes: dict[int, int] = {}
        self._paths: tuple[str, ...] = ()
        self._poller: threading.Thread | None = None
        self._stop = threading.Event()
        self.polls = 0    # for tests and benchmarks: how often the poller looked
        self.wakes = 0    # and how often it found a change

    # --- signals --------------------------------------------------------------------------

    def install_signal(self, signo: int, action: int) -> int:
        if threading.current_thread() is not threading.main_thread():
            return -errno.EINVAL   # Python's rule: handlers are installed from the main thread
        try:
            signal.signal(signo, self._on_signal)
            signal.siginterrupt(signo, False)
        except (OSError, ValueError) as exc:
            return -(getattr(exc, "errno", None) or errno.EINVAL)
        self._codes[signo] = action
        return 0

    def _on_signal(self, signo: int, _frame: object) -> None:
        if self.on_main_thread is not None:
            self.on_main_thread()
        code = self._codes.get(signo)
        if code is not None:
            self._send(code)

    def wake_main_thread(self) -> bool:
        """Run the main thread's handler soon (at its next bytecode), as a signal would, without
        one. False when no handler is installed: then nothing runs there."""
        if not self._codes:
            return False
        # Any signal number works; typeshed names only the Signals enum's.
        _thread.interrupt_main(cast(signal.Signals, next(iter(self._codes))))
        return True

    def signal_fd(self) -> int:
        return self._read_fd

    def _send(self, code: int) -> None:
        try:
            os.write(self._write_fd, bytes((code,)))
        except (BlockingIOError, OSError):
            pass

    # --- the poll --------------------------------------------------------------------------

    def poll_paths(self, paths: bytes) -> None:
        self._paths = tuple(os.fsdecode(p) for p in paths.split(b"\0") if p)

    def poll_start(self, interval_us: int, pid: int, action: int) -> int:
        if self._poller is not None:
            return 0
        if interval_us <= 0:
            return -errno.EINVAL
        self._poller = threading.Thread(target=self._poll, args=(interval_us / 1e6, pid, action),
                                        name="malleable-poll", daemon=True)
        self._poller.start()
        return 0

    def _snapshot(self, pid: int) -> tuple[object, ...]:
        try:
            mask: object = frozenset(os.sched_getaffinity(pid))
        except OSError:
            mask = None
        seen: list[object] = [mask]
        for path in self._paths:
            try:
                with open(path, "rb") as f:
                    seen.append(f.read(4096))
            except OSError as exc:
                seen.append(exc.errno)
        return tuple(seen)

    def _poll(self, interval_s: float, pid: int, action: int) -> None:
        last = self._snapshot(pid)
        while not self._stop.wait(interval_s):
            now = self._snapshot(pid)
            self.polls += 1
            if now != last:
                self.wakes += 1
                last = now
                self._send(action)

    def stop(self) -> None:
        self._stop.set()
        if self._poller is not None and self._poller is not threading.current_thread():
            self._poller.join(timeout=2)
