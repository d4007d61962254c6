"""The metrics the field reports for a schedule, from its jobs' submit, start and end times:
response (submit to end), wait (submit to start), bounded slowdown. Pure."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

# Bounded slowdown's threshold: a job shorter than this counts as this long, so that a few
# seconds' wait of a one-second job does not dominate the mean (Feitelson et al.'s tau).
TAU_S = 10.0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, linear between the nearest ranks (numpy's default)."""
    if not values:
        raise ValueError("no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def bounded_slowdown(response_s: float, runtime_s: float, tau_s: float = TAU_S) -> float:
    """Response over the runtime (at least ``tau_s``), never below 1: a job that ran faster
    than its runtime at its requested size (it grew) is not credited below no slowdown."""
    return max(1.0, response_s / max(runtime_s, tau_s))


# What regimes are compared on (lower is better on each): the agent's own effect is a regime
# against static with the same asks, the effect of asking for less is that against static.
COMPARED = ("makespan_s", "mean_response_s", "p95_response_s", "mean_wait_s", "p95_wait_s",
            "mean_bounded_slowdown")


def ratios(row: Mapping[str, float], base: Mapping[str, float]) -> dict[str, float | None]:
    """Each compared metric of ``row`` over ``base``'s (None where the base is 0)."""
    return {m: row[m] / base[m] if base[m] else None for m in COMPARED}
