"""Linux CPU list strings ("0-3,8,10-11"), as in cpuset.cpus, Cpus_allowed_list and Slurm's CPU_IDs."""
from __future__ import annotations

from typing import Iterable

MAX_CPU_ID = 1 << 16


def parse_cpu_list(text: str) -> frozenset[int]:
    """Parse "0-3,8" into {0,1,2,3,8}. An empty string is the empty set. Raises ValueError."""
    text = text.strip()
    cpus: set[int] = set()
    if not text:
        return frozenset()
    for part in text.split(","):
        part = part.strip()
        lo_s, sep, hi_s = part.partition("-")
        if not lo_s.isdigit() or (sep and not hi_s.isdigit()):
            raise ValueError(f"malformed CPU list {text!r}")
        lo, hi = int(lo_s), int(hi_s) if sep else int(lo_s)
        if hi < lo or hi >= MAX_CPU_ID:
            raise ValueError(f"malformed CPU range {part!r} in {text!r}")
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Format {0,1,2,3,8} as "0-3,8" (the form the kernel writes back)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
