"""Helpers for the benchmark scripts: run a worker process, save JSON, draw a PNG."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def run_worker(args: list[str], *, timeout: float = 600, env: dict | None = None) -> dict:
    """Run ``python args...`` in benchmarks/ and return the JSON after its "RESULT " line."""
    proc = subprocess.run([sys.executable, *args], cwd=HERE, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"worker {args} printed no result (exit {proc.returncode}):\n"
                       f"{proc.stderr[-3000:]}")


def machine() -> dict:
    return {"cpus": os.cpu_count(), "allowed_cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "kernel": platform.release(),
            "loadavg_start": os.getloadavg()[0], "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


def save(name: str, data: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=True))
    print(f"wrote {path}")
    return path


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def percentile(xs, q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[k]
