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
import os
import subprocess
import time

from benchmarks.common import REPO, TORCH_PYTHON, CpusetFolder, machine, save


def measure(workers: int, seconds: float) -> dict:
    full = (CpusetFolder.ROOT / "cpuset.cpus").read_text().strip()
    cg = CpusetFolder(f"torch_dataloader_{workers}", full)
    proc = None
    try:
        proc = subprocess.Popen(
            [str(TORCH_PYTHON), "-c", f"import os; open('{cg.path}/cgroup.procs', 'w')"
             f".write(str(os.getpid())); import runpy, sys; sys.argv = ['w', '--workers', "
             f"'{workers}']; runpy.run_module('benchmarks.framework.torch_dataloader_worker', "
             "run_name='__main__')"],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "MALLEABLE_TF_LOG": "0"})
        assert proc.stdout.readline().startswith("READY")
        out = {}
        for cpus in (full, "0", full):
            cg.set_cpus(cpus)
            time.sleep(1.0)                  # the runtime follows; the pipeline settles
            proc.stdin.write(f"{seconds}\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            assert line.startswith("RESULT "), line
            out.setdefault(cpus, []).append(json.loads(line[7:]))
        return out
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        cg.remove()


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
