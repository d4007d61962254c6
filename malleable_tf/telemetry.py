"""Each process's status record for the co-scheduler (``malleable_protocol.RankStatus``):
steps/s per thread count, written small and atomically. The agent reads it as untrusted input."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from malleable_protocol import RankStatus, ResizeEvent
from malleable_protocol.records import MAX_THREAD_COUNTS

if TYPE_CHECKING:
    from .runtime import ThreadState

log = logging.getLogger("malleable_tf")


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
                 status_path: Path | None = None):
        self.rank, self.local_rank, self.local_size = rank, local_rank, local_size
        self.status_path = status_path
        self._rate = StepRate()
        self._steps = 0
        self._resizes = 0
        self._last: ResizeEvent | None = None

    def record_steps(self, threads: int, steps: int, seconds: float) -> None:
        self._rate.record(threads, steps, seconds)
        self._steps += max(0, steps)

    def resized(self, event: ResizeEvent) -> None:
        self._resizes += 1
        self._last = event

    def record(self, state: ThreadState) -> RankStatus:
        return RankStatus(
            pid=os.getpid(), node=os.environ.get("SLURMD_NODENAME", "")[:64], rank=self.rank,
            local_rank=self.local_rank, local_size=self.local_size,
            intra_active=state.intra_active, intra_pool=state.intra_pool,
            inter_active=state.inter_active, inter_pool=state.inter_pool,
            allowed_cpus=state.allowed_cpus, share_cpus=state.share_cpus,
            steps_per_s=dict(self._rate.rates), steps=self._steps,
            resizes=self._resizes, last_resize=self._last, updated=time.time())

    def write(self, record: RankStatus) -> None:
        """Write ``record`` to ``status_path`` (which must be set); a failure is logged."""
        try:
            write_status(self.status_path, record)
        except OSError as exc:
            log.warning("malleable_tf: cannot write status to %s: %s", self.status_path, exc)
