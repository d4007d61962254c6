"""Which threads of a process actually run: CPU time per thread from /proc, over a window."""
from __future__ import annotations

import os
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def thread_cpu_ticks(pid: int | str = "self") -> dict[int, int]:
    """utime+stime in clock ticks for every thread of ``pid``."""
    out: dict[int, int] = {}
    base = Path(f"/proc/{pid}/task")
    for entry in base.iterdir():
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        out[int(entry.name)] = int(fields[11]) + int(fields[12])
    return out


def busy_threads(window_s: float = 0.5, *, pid: int | str = "self", min_share: float = 0.2,
                 exclude: set[int] | None = None) -> list[int]:
    """Threads that used at least ``min_share`` of one CPU during the window."""
    before = thread_cpu_ticks(pid)
    time.sleep(window_s)
    after = thread_cpu_ticks(pid)
    need = min_share * window_s * CLK_TCK
    return sorted(t for t, ticks in after.items()
                  if ticks - before.get(t, ticks) >= need and t not in (exclude or set()))
