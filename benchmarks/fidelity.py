"""Fidelity and overhead of thread parking, against plain TensorFlow, side by side.

For every N up to the machine's cores: steps/s of a process whose pools have M = cores threads
with N active (malleable_tf following an N-core allowance) against a plain TensorFlow process
started with N threads, both pinned to the same N cores. The two alternate, round after round,
in one run, so machine noise hits both. N = M is the overhead of malleable_tf when not resizing.

    python benchmarks/fidelity.py [--rounds 5] [--seconds 3]

Writes benchmarks/results/fidelity.json and fidelity.png.
"""
from __future__ import annotations

import argparse
import os

from common import machine, median, run_worker, save


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    env = {"BENCH_SECONDS": str(args.seconds), "MALLEABLE_TF_LOG": "0"}
    rows = []
    for n in range(1, cores + 1):
        ratios: dict[str, list[float]] = {}
        cpu_ratios: dict[str, list[float]] = {}
        samples = []
        for r in range(args.rounds):
            # Alternate which goes first, so a trend in machine load favours neither.
            order = ["plain", "malleable"] if r % 2 == 0 else ["malleable", "plain"]
            got = {}
            for mode in order:
                argv = ["fidelity_worker.py", mode, str(n)] + ([str(cores)] if mode == "malleable" else [])
                got[mode] = run_worker(argv, env=env)
            samples.append(got)
            for w in got["plain"]:
                ratios.setdefault(w, []).append(got["malleable"][w]["wall"] / got["plain"][w]["wall"])
                cpu_ratios.setdefault(w, []).append(
                    got["malleable"][w]["cpu"] / got["plain"][w]["cpu"])
            print(f"N={n} round {r}: " + ", ".join(
                f"{w} {got['malleable'][w]['wall']:.1f}/{got['plain'][w]['wall']:.1f}"
                for w in got["plain"]), flush=True)
        rows.append({"active": n, "pool": cores, "samples": samples,
                     "ratio_median": {w: median(v) for w, v in ratios.items()},
                     "ratios": ratios,
                     "cpu_ratio_median": {w: median(v) for w, v in cpu_ratios.items()},
                     "cpu_ratios": cpu_ratios})
    data = {"benchmark": "fidelity", "machine": machine(), "rounds": args.rounds,
            "seconds_per_measure": args.seconds, "goal": {"fidelity": 0.95, "overhead": 0.98},
            "rows": rows}
    save("fidelity", data)
    plot(data)


def plot(data: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = data["rows"]
    workloads = list(rows[0]["ratio_median"])
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.8 / len(workloads)
    for i, w in enumerate(workloads):
        xs = [row["active"] + (i - (len(workloads) - 1) / 2) * width for row in rows]
        ax.bar(xs, [row["ratio_median"][w] for row in rows], width, label=w)
        for row, x in zip(rows, xs):
            ax.plot([x] * len(row["ratios"][w]), row["ratios"][w], "k.", ms=3)
    ax.axhline(0.95, color="r", ls="--", lw=1, label="goal 0.95")
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set_xticks([row["active"] for row in rows])
    ax.set_xlabel(f"active threads N (pool M = {rows[0]['pool']})")
    ax.set_ylabel("steps/s malleable / plain TF with N threads")
    ax.set_title("Thread parking fidelity, wall-clock steps/s\n(bars: median of rounds; dots: rounds)",
                 fontsize=10)
    ax.set_ylim(0, max(1.3, max(max(r) for row in rows for r in row["ratios"].values()) + 0.05))
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = os.path.join(os.path.dirname(__file__), "results", "fidelity.png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
