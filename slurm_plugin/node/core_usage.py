"""One job's cores on one node since it was first seen there (``CoreUsage``): the record the
node's ledger keeps per running job and ``accounting`` integrates. A leaf: the ledger and the
accounting both import it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

MAX_CORES = 1 << 16          # cores of one node, far above any real one
MAX_TIME = 1e11              # wall time in seconds (year 5138)
MAX_CORE_S = 1e15            # 65,536 cores for 480 years


@dataclass(frozen=True)
class CoreUsage:
    """One job's cores on one node since it was first seen there."""

    allocation: int             # cores of the job's Slurm allocation on the node
    width: int                  # cores its cpuset holds since ``since`` (until the next write)
    since: float                # wall time of the last observation (the last integrated to)
    start: float                # wall time it was first seen on the node
    borrowed_core_s: float = 0.0
    lent_core_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"allocation": self.allocation, "width": self.width, "since": self.since,
                "start": self.start, "borrowed": self.borrowed_core_s, "lent": self.lent_core_s}

    @classmethod
    def from_json(cls, d: Any) -> "CoreUsage":
        """Raises ValueError on anything but what ``to_json`` writes, within bounds."""
        if not isinstance(d, dict):
            raise ValueError("usage is not a map")
        return cls(allocation=_count(d, "allocation"), width=_count(d, "width"),
                   since=_number(d, "since", MAX_TIME), start=_number(d, "start", MAX_TIME),
                   borrowed_core_s=_number(d, "borrowed", MAX_CORE_S),
                   lent_core_s=_number(d, "lent", MAX_CORE_S))


def _count(d: Mapping[str, Any], key: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_CORES:
        raise ValueError(f"bad usage {key}: {v!r:.32}")
    return v


def _number(d: Mapping[str, Any], key: str, hi: float) -> float:
    v = d.get(key)
    # NaN fails both comparisons; a 400-digit int is above hi (no float overflow).
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= hi:
        raise ValueError(f"bad usage {key}: {v!r:.32}")
    return float(v)
