"""Resize latency during training, by API and by signal, and follow latency after a cpuset or
affinity change from outside. A Keras CNN trains continuously on every measure.

    python -m benchmarks.framework.resize_latency [--resizes 200] [--follows 40]

Writes benchmarks/results/resize_latency.json and resize_latency.png.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, RESULTS, machine, median, percentile, run_worker, save
from malleable_runtime.runtime import pin_all_threads
from malleable_protocol.cpulist import parse_cpu_list

CPUSET = Path("/sys/fs/cgroup/cpuset")


def follow_latencies(count: int, how: str) -> list[float]:
    """Narrow and widen a training process's CPUs, 2 cores <-> 1, by its cpuset (``how`` =
    "cpuset") or by the affinity of all its threads ("affinity"); time each change until the
    process has adjusted its threads (its status record's resize time)."""
    cg = CPUSET / f"malleable_bench_{os.getpid()}"
    cg.mkdir()
    status = Path(f"/tmp/malleable_bench_status_{os.getpid()}.json")
    proc = None
    try:
        (cg / "cpuset.mems").write_text((CPUSET / "cpuset.mems").read_text())
        full = (CPUSET / "cpuset.cpus").read_text().strip()
        (cg / "cpuset.cpus").write_text(full)
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.framework.latency_worker", "follow"],
                                cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env={**os.environ, "MALLEABLE_TF_STATUS": str(status),
                                     "MALLEABLE_TF_LOG": "0", "TF_CPP_MIN_LOG_LEVEL": "2"})
        (cg / "cgroup.procs").write_text(str(proc.pid))
        assert proc.stdout.readline().startswith("READY")
        out = []
        for i in range(count):
            before = json.loads(status.read_text())["resizes"]
            t0 = time.time()
            if how == "cpuset":
                (cg / "cpuset.cpus").write_text("0" if i % 2 == 0 else full)
            else:
                pin_all_threads(frozenset({0}) if i % 2 == 0 else parse_cpu_list(full),
                                pid=proc.pid)
            deadline = time.time() + 5
            while time.time() < deadline:
                rec = json.loads(status.read_text())
                if rec["resizes"] > before:
                    out.append(rec["last_resize"]["time"] - t0)
                    break
                time.sleep(0.001)
            time.sleep(0.3)
        return out
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        for pid in (cg / "cgroup.procs").read_text().split():
            try:
                (CPUSET / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        cg.rmdir()
        status.unlink(missing_ok=True)


def summary(xs: list[float]) -> dict:
    ms = [x * 1000 for x in xs]
    return {"n": len(ms), "p50_ms": median(ms), "p95_ms": percentile(ms, 95),
            "p99_ms": percentile(ms, 99), "max_ms": max(ms) if ms else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--resizes", type=int, default=200)
    ap.add_argument("--follows", type=int, default=40)
    args = ap.parse_args()
    inproc = run_worker("benchmarks.framework.latency_worker", ["inproc", str(args.resizes)],
                        env={"MALLEABLE_TF_LOG": "0", "TF_CPP_MIN_LOG_LEVEL": "2"})
    follows = follow_latencies(args.follows, "cpuset")
    follows_affinity = follow_latencies(args.follows, "affinity")
    data = {"benchmark": "resize_latency", "machine": machine(),
            "goal": {"resize_p50_ms": 5, "resize_p99": "under one training step",
                     "follow_p50_ms": 50},
            "api": summary(inproc["api_s"]), "signal": summary(inproc["signal_s"]),
            "follow_cpuset": summary(follows), "follow_affinity": summary(follows_affinity),
            "train_step": summary(inproc["step_s"]),
            "raw_s": {"api": inproc["api_s"], "signal": inproc["signal_s"], "follow": follows,
                      "follow_affinity": follows_affinity}}
    save("resize_latency", data)
    for k in ("api", "signal", "follow_cpuset", "follow_affinity", "train_step"):
        print(f"{k:>14}: p50 {data[k]['p50_ms']:.2f} ms, p99 {data[k]['p99_ms']:.2f} ms (n={data[k]['n']})")
    plot(data)


def plot(data: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4))
    series = [("API", data["raw_s"]["api"]), ("signal", data["raw_s"]["signal"]),
              ("follow cpuset", data["raw_s"]["follow"]),
              ("follow affinity", data["raw_s"]["follow_affinity"])]
    ax.boxplot([[x * 1000 for x in s] for _, s in series], tick_labels=[n for n, _ in series],
               whis=(1, 99), showfliers=True)
    ax.axhline(data["train_step"]["p50_ms"], color="g", ls=":", label="median training step")
    ax.axhline(5, color="r", ls="--", lw=1, label="goal p50 resize 5 ms")
    ax.axhline(50, color="m", ls="--", lw=1, label="goal p50 follow 50 ms")
    ax.set_yscale("log")
    ax.set_ylabel("latency (ms, log)")
    ax.set_title("Resize latency while a Keras CNN trains (whiskers p1-p99)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "resize_latency.png", dpi=110)
    print(f"wrote {RESULTS / 'resize_latency.png'}")


if __name__ == "__main__":
    main()
