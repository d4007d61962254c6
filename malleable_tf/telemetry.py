"""Each process's status record for the co-scheduler (``malleable_protocol.RankStatus``):
steps/s per thread count, written small and atomically. The agent reads it as untrusted input."""
from __future__ import annotations

import os
from pathlib import Path

from malleable_protocol import RankStatus
from malleable_protocol.records import MAX_THREAD_COUNTS


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
