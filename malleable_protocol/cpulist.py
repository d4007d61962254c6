"""Linux CPU list strings ("0-3,8,10-11"), as in cpuset.cpus, Cpus_allowed_list and Slurm's CPU_IDs."""
from __future__ import annotations

import re
from typing import Iterable

MAX_CPU_ID = 1 << 16
_PART = re.compile(r"([0-9]{1,6})(?:-([0-9]{1,6}))?")


def parse_cpu_list(text: str, *, limit: int = MAX_CPU_ID) -> frozenset[int]:
    """Parse "0-3,8" into {0,1,2,3,8}. An empty string is the empty set. Raises ValueError.

    Ranges must be ascending and apart, as the kernel and Slurm write them, and every CPU id
    below ``limit``: checked before anything is expanded, so a list costs at most ``limit``
    set insertions whatever its length (a root parser of lists a job user writes)."""
    text = text.strip()
    if not text:
        return frozenset()
    cpus: list[range] = []
    last = -1
    for part in text.split(","):
        m = _PART.fullmatch(part.strip())
        if m is None:
            raise ValueError(f"malformed CPU list item {part[:32]!r}")
        lo = int(m[1])
        hi = int(m[2]) if m[2] is not None else lo
        if hi < lo or lo <= last or hi >= limit:
            raise ValueError(f"CPU range {part[:32]!r} out of order or above {limit - 1}")
        cpus.append(range(lo, hi + 1))
        last = hi
    return frozenset().union(*cpus)


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
