"""Each process's status record for the co-scheduler (``malleable_protocol.RankStatus``):
steps/s per thread count, written small and atomically. The agent reads it as untrusted input.

Steps come as a running count (``malleable_tf.step()``, the optimizer counter of
``malleable_tf.keras``); ``StepWindows`` cuts it into windows of one intra-op thread count each,
observed by ``StepSampler`` twice a second and by the runtime on every resize.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from malleable_protocol import RankStatus, ResizeEvent
from malleable_protocol.records import MAX_THREAD_COUNTS

from .state import ThreadState

log = logging.getLogger(__name__)


class StepRate:
    """Steps/s per thread count: an exponentially weighted mean, so old phases fade."""

    def __init__(self, alpha: float = 0.3):
        self.alpha = alpha
        self.rates: dict[int, float] = {}

    def record(self, threads: int, steps: int, seconds: float) -> None:
        if steps <= 0 or seconds <= 0:
            return
        rate = steps / seconds
        old = self.rates.get(threads)
        self.rates[threads] = rate if old is None else (1 - self.alpha) * old + self.alpha * rate
        while len(self.rates) > MAX_THREAD_COUNTS:
            self.rates.pop(next(iter(self.rates)))


class StepCounter:
    """Steps reported from Python (``malleable_tf.step``): a total behind a lock of its own, so a
    call costs an uncontended acquire and an add, never the runtime's lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0

    def add(self, n: int = 1) -> None:
        with self._lock:   # += on an attribute is not atomic across threads
            self._total += n

    @property
    def total(self) -> int:
        return self._total


@dataclass(frozen=True)
class StepWindow:
    """``steps`` done with ``threads`` intra-op threads in ``seconds`` (0: when is not known;
    such steps count, but not towards steps/s)."""

    threads: int
    steps: int
    seconds: float


class StepWindows:
    """Cuts a running step count, observed now and then, into windows of one intra-op thread
    count each: the one piece of windowing for every source of steps.

    A window begins and ends at observations, mostly ones that saw the count move, so a pause at
    its edges is left out. It closes on a resize (its steps belong to the thread count that was
    in force), once it is ``window_s`` long, and when no step came for ``window_s`` (the end of a
    phase: its steps reach the status record). Steps that come after a gap longer than
    ``idle_steps`` steps (and ``window_s``) ran at some unknown moment of it: the first ones
    (tracing), the ones after an evaluation or a checkpoint. They count but are not timed.
    """

    def __init__(self, *, window_s: float = 2.0, idle_steps: float = 4.0):
        self.window_s = window_s
        self.idle_steps = idle_steps
        self._threads: int | None = None   # None until the first observation
        self._start = 0.0                  # when the open window began
        self._base = 0                     # the count then
        self._total = 0                    # the count at the last observation
        self._moved_at: float | None = None  # the last observation that saw the count move
        self._step_s: float | None = None    # seconds per step in the last window closed

    def observe(self, now: float, total: int, threads: int, *,
                flush: bool = False) -> list[StepWindow]:
        """``total`` steps were done by ``now``, with ``threads`` in force from now on. Returns
        the windows this closes; ``flush`` closes the open one as well (an epoch's end, exit)."""
        if self._threads is None:   # the first observation: steps before it are not timed
            self._threads, self._start = threads, now
        total = max(total, self._total)   # a running count: a failed read must not go back
        out: list[StepWindow] = []
        last_step = self._start if self._moved_at is None else self._moved_at
        if total > self._total:
            if self._after_gap(now):
                out += self._close(last_step, reopen_at=now)
                out.append(StepWindow(self._threads, total - self._total, 0.0))
                self._step_s = (now - self._moved_at) / (total - self._total) \
                    if self._moved_at is not None else None   # a bound that undoes a bad guess
                self._base = total
            self._total, self._moved_at = total, now
            if threads != self._threads or now - self._start >= self.window_s or flush:
                out += self._close(now, reopen_at=now)
        elif threads != self._threads:
            out += self._close(last_step, reopen_at=now)
        elif self._total > self._base and self._moved_at is not None and \
                (flush or now - self._moved_at >= self.window_s):
            out += self._close(self._moved_at, reopen_at=self._moved_at)
        self._threads = threads
        return out

    def _after_gap(self, now: float) -> bool:
        if self._moved_at is None:
            return True   # the first steps: tracing, warm-up
        if self._step_s is None:
            return False  # no step time known yet: a slow step is not a pause
        return now - self._moved_at > max(self.window_s, self.idle_steps * self._step_s)

    def _close(self, end: float, *, reopen_at: float) -> list[StepWindow]:
        steps = self._total - self._base
        out = []
        if steps > 0:
            seconds = max(0.0, end - self._start)
            out.append(StepWindow(self._threads, steps, seconds))
            if seconds > 0:
                self._step_s = seconds / steps
        self._start, self._base = reopen_at, self._total
        return out


class StepSampler:
    """The thread that calls ``sample`` every ``interval_s``. It starts in ``start``, never in
    the constructor, and ``stop`` ends it."""

    def __init__(self, sample: Callable[[], None], interval_s: float = 0.5):
        self.interval_s = interval_s
        self._sample = sample
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="malleable-steps", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample()
            except Exception as exc:  # noqa: BLE001 - the sampler must outlive any one bad read
                log.warning("malleable: step sampler: %s", exc)


def write_status(path: Path, record: RankStatus) -> None:
    data = record.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class Telemetry:
    """What one rank reports: steps/s per thread count, steps, resizes, and the last resize,
    with the thread state the runtime hands in, as a status record written to ``status_path``."""

    def __init__(self, *, rank: int, local_rank: int, local_size: int,
                 status_path: Path | None = None, node: str = ""):
        self.rank, self.local_rank, self.local_size = rank, local_rank, local_size
        self.status_path = status_path
        self.node = node[:64]
        # None until the runtime's handlers are in: the agent then sends no signal at all.
        self.reload_signal: int | None = None
        self._rate = StepRate()
        self._steps = 0
        self._resizes = 0
        self._last: ResizeEvent | None = None
        self._write_failure: str | None = None   # the last failed write's error, until one works

    def record_steps(self, threads: int, steps: int, seconds: float) -> None:
        self._rate.record(threads, steps, seconds)
        self._steps += max(0, steps)

    def resized(self, event: ResizeEvent) -> None:
        self._resizes += 1
        self._last = event

    def record(self, state: ThreadState) -> RankStatus:
        return RankStatus(
            pid=os.getpid(), node=self.node, rank=self.rank,
            local_rank=self.local_rank, local_size=self.local_size,
            intra_active=state.intra_active, intra_pool=state.intra_pool,
            inter_active=state.inter_active, inter_pool=state.inter_pool,
            allowed_cpus=state.allowed_cpus, share_cpus=state.share_cpus,
            steps_per_s=dict(self._rate.rates), steps=self._steps,
            resizes=self._resizes, last_resize=self._last, updated=time.time(),
            reload_signal=self.reload_signal)

    def write(self, record: RankStatus) -> None:
        """Write ``record`` to ``status_path`` (which must be set). A failure is logged once
        until it changes or the writes succeed again: after an uninstall every write fails, and
        a job writes several times a second."""
        try:
            write_status(self.status_path, record)
        except OSError as exc:
            failure = f"{type(exc).__name__}: {exc.strerror or exc}"
            if failure != self._write_failure:
                log.warning("malleable: cannot write status to %s: %s (said once until it "
                            "changes)", self.status_path, exc)
            self._write_failure = failure
            return
        if self._write_failure is not None:
            log.warning("malleable: status written to %s again", self.status_path)
            self._write_failure = None
