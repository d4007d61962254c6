"""Each process's status record for the co-scheduler: small, bounded, written atomically.

The agent reads these files as untrusted input; this side keeps them small and well-formed.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

MAX_THREAD_COUNTS = 256     # steps/s is kept for at most this many distinct thread counts
MAX_RECORD_BYTES = 16384


@dataclass
class ResizeEvent:
    time: float
    intra_before: int
    intra_after: int
    inter_before: int
    inter_after: int
    reason: str
    latency_ms: float


@dataclass
class StatusRecord:
    pid: int
    node: str
    rank: int
    local_rank: int
    local_size: int
    intra_active: int
    intra_pool: int
    inter_active: int
    inter_pool: int
    allowed_cpus: list[int]
    share_cpus: list[int]
    # Mean steps/s at each intra-op thread count this process has run with (keys are counts).
    steps_per_s: dict[str, float] = field(default_factory=dict)
    resizes: int = 0
    last_resize: ResizeEvent | None = None
    updated: float = 0.0


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


def write_status(path: Path, record: StatusRecord) -> None:
    record.updated = time.time()
    data = json.dumps(asdict(record), sort_keys=True)
    if len(data) > MAX_RECORD_BYTES:  # cannot happen with the bounds above; never write more
        raise ValueError("status record over its size bound")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(data)
    os.replace(tmp, path)
