"""What does not follow the cores in a PyTorch job: DataLoader workers. A malleable_torch
process trains on batches from a DataLoader with 0 or 2 worker processes (CPU work per sample),
in a cpuset of 2 cores, then of 1 (the co-scheduler's shrink); at each size, the training
thread's count, the samples/s, and the CPU each process takes.

    python -m benchmarks.framework.torch_dataloader [--seconds 4]

The worker runs on .venv-torch's Python. Writes benchmarks/results/torch_dataloader.json.
"""
from __future__ import annotations

import argparse
import json
import time

from benchmarks.common import machine, save, torch_worker_in_cpuset


def measure(workers: int, seconds: float) -> dict:
    with torch_worker_in_cpuset(f"torch_dataloader_{workers}",
                                "benchmarks.framework.torch_dataloader_worker",
                                ["--workers", str(workers)]) as (proc, cg, full):
        assert proc.stdout.readline().startswith("READY")
        out: dict[str, list] = {}
        for cpus in (full, "0", full):
            cg.set_cpus(cpus)
            time.sleep(1.0)                  # the runtime follows; the pipeline settles
            proc.stdin.write(f"{seconds}\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            assert line.startswith("RESULT "), line
            out.setdefault(cpus, []).append(json.loads(line[7:]))
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()
    rows = {}
    for workers in (0, 2):
        rows[f"{workers} workers"] = measure(workers, args.seconds)
        for cpus, results in rows[f"{workers} workers"].items():
            for r in results:
                print(f"{workers} workers, cpuset {cpus}: {r['samples_per_s']:.0f} samples/s, "
                      f"training threads {r['torch_threads']}, main {r['main_cpu']:.2f} CPU, "
                      f"workers {r['workers_cpu']} CPU ({r['worker_threads']} threads)",
                      flush=True)
    save("torch_dataloader", {
        "benchmark": "DataLoader workers when a malleable_torch job's cpuset shrinks",
        "machine": machine(), "seconds": args.seconds,
        "method": "one process per row, in its own cpuset: 2 cores, then 1, then 2 again; "
                  "after each change 1 s to settle, then a measured window",
        "rows": rows})


if __name__ == "__main__":
    main()
