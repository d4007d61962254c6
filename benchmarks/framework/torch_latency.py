"""malleable_torch's resize latency during training, per control path: from the trigger (the
API called from another thread, a control signal, a cpuset change, an affinity change from
outside) to the moment the training thread runs with the new count (its torch.get_num_threads()
changed between two training steps: the worker's APPLIED line). An MLP trains continuously in
the worker's main thread (a step takes a few ms here, so the latency includes up to one step).

    python -m benchmarks.framework.torch_latency [--resizes 40]

The worker runs on .venv-torch's Python (scripts/setup.sh --torch). Writes
benchmarks/results/torch_latency.json.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time

from benchmarks.common import (TORCH_PYTHON, machine, median, percentile, save,
                               torch_worker_in_cpuset)
from malleable_protocol.cpulist import parse_cpu_list
from malleable_runtime.runtime import pin_all_threads

def measure(path: str, count: int) -> list[float]:
    with torch_worker_in_cpuset(f"torch_latency_{path}",
                                "benchmarks.framework.torch_latency_worker") as (proc, cg, full):
        ready = proc.stdout.readline()
        assert ready.startswith("READY 2"), ready
        out = []
        for i in range(count):
            n = 1 if i % 2 == 0 else 2
            t0 = time.time()
            if path == "api":
                proc.stdin.write(f"API {n}\n")
                proc.stdin.flush()
            elif path == "signal":
                os.kill(proc.pid, signal.SIGUSR2 if n == 1 else signal.SIGURG)
            elif path == "cpuset":
                cg.set_cpus("0" if n == 1 else full)
            else:
                pin_all_threads(frozenset({0}) if n == 1 else parse_cpu_list(full), pid=proc.pid)
            line = proc.stdout.readline().split()
            assert line[0] == "APPLIED" and int(line[2]) == n, line
            out.append(float(line[1]) - t0)
            time.sleep(0.3)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--resizes", type=int, default=40)
    args = ap.parse_args()
    rows = {}
    for path in ("api", "signal", "cpuset", "affinity"):
        ms = [s * 1000 for s in measure(path, args.resizes)]
        rows[path] = {"n": len(ms), "p50_ms": median(ms), "p95_ms": percentile(ms, 95),
                      "max_ms": max(ms), "ms": [round(x, 2) for x in ms]}
        print(f"{path:9s} p50 {rows[path]['p50_ms']:.1f} ms  p95 {rows[path]['p95_ms']:.1f} ms  "
              f"max {rows[path]['max_ms']:.1f} ms  (n={len(ms)})", flush=True)
    version = subprocess.run([str(TORCH_PYTHON), "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    save("torch_latency", {
        "benchmark": "malleable_torch resize latency per control path", "torch": version,
        "machine": machine(), "resizes": args.resizes,
        "method": "an MLP trains in the worker's main thread; each trigger alternates 2 -> 1 -> 2 "
                  "threads; latency = the time the training thread first ran a step with the new "
                  "torch.get_num_threads() minus the trigger's time (one clock, one machine)",
        "rows": rows})


if __name__ == "__main__":
    main()
