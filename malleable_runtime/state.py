"""``ThreadState``: what a process's pools run with now. The one type the runtime (which makes
it) and the telemetry (which reports it) share, in a module of its own so that neither imports
the other for it. Users get it from the package: ``malleable_tf.ThreadState``."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ThreadState:
    intra_active: int
    intra_pool: int
    inter_active: int
    inter_pool: int
    allowed_cpus: frozenset[int]
    share_cpus: frozenset[int]
    following: bool
