"""Fidelity and overhead of thread parking, against plain TensorFlow, side by side.

For every N up to the machine's cores: steps/s of a process whose pools have M = cores threads
with N active (malleable_tf following an N-core allowance, its tf.data map function gated)
against a plain TensorFlow process started with N threads, both pinned to the same N cores. N = M is the overhead of malleable_tf
when not resizing.

Both processes stay alive and take turns: a burst of ``--seconds`` each, in random order, round
after round, the idle one stopped (SIGSTOP), so the machine's slow drifts hit both alike. Each
round gives one ratio. A process is lucky or unlucky for its whole life here (an A/A run of two
identical configurations gave per-pair medians from 0.84 to 1.25), so both are started afresh
``--pairs`` times, ``--rounds`` rounds each; the result is the median of all ratios with a
bootstrap 95% confidence interval that resamples whole pairs.

    python benchmarks/fidelity.py [--pairs 10] [--rounds 4] [--seconds 1]

Writes benchmarks/results/fidelity.json and fidelity.png.
"""
from __future__ import annotations

import argparse
import os
import random

from common import BurstWorker, machine, median, median_ci, save

WORKLOADS = ("keras_cnn", "matmul", "tf_data")
GOALS = {"fidelity": 0.95, "overhead": 0.98}


def measure(n: int, pool: int, args, rng: random.Random) -> dict:
    env = {"MALLEABLE_TF_LOG": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
    # rates[workload][mode][pair] = the rounds of that pair
    rates: dict[str, dict[str, list[list[dict]]]] = {
        w: {"plain": [], "malleable": []} for w in WORKLOADS}
    for pair in range(args.pairs):
        for modes in rates.values():
            for rounds in modes.values():
                rounds.append([])
        workers = {"plain": BurstWorker(["fidelity_worker.py", "plain", str(n)], env=env),
                   "malleable": BurstWorker(["fidelity_worker.py", "malleable", str(n), str(pool)],
                                            env=env)}
        try:
            for w in workers.values():
                w.start()
            for r in range(args.rounds):
                for workload in WORKLOADS:
                    order = list(workers)
                    rng.shuffle(order)
                    for mode in order:
                        rates[workload][mode][pair].append(
                            workers[mode].burst(workload, args.seconds))
            print(f"N={n} pair {pair}: " + ", ".join(
                f"{wl} {median(_ratios(m['malleable'][pair], m['plain'][pair], 'wall')):.3f}"
                for wl, m in rates.items()), flush=True)
        finally:
            for w in workers.values():
                w.close()
    row = {"active": n, "pool": pool, "workloads": {}}
    for workload, modes in rates.items():
        out = {}
        for kind in ("wall", "cpu"):
            groups = [_ratios(a, b, kind) for a, b in zip(modes["malleable"], modes["plain"])]
            ratios = [r for g in groups for r in g]
            lo, hi = median_ci(groups)
            out[kind] = {"median": median(ratios), "ci95": [lo, hi], "ratios": ratios,
                         "pair_medians": [median(g) for g in groups]}
        out["steps_per_s"] = {m: median([x["wall"] for pair in v for x in pair])
                              for m, v in modes.items()}
        row["workloads"][workload] = out
    return row


def _ratios(malleable: list[dict], plain: list[dict], kind: str) -> list[float]:
    return [a[kind] / b[kind] for a, b in zip(malleable, plain)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=4, help="rounds per pair")
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    rng = random.Random(1)
    rows = [measure(n, cores, args, rng) for n in range(1, cores + 1)]
    data = {"benchmark": "fidelity", "machine": machine(), "rounds_per_pair": args.rounds,
            "pairs": args.pairs, "seconds_per_burst": args.seconds, "goal": GOALS,
            "method": "interleaved bursts, idle worker SIGSTOPped; ratio = malleable/plain "
                      "steps/s per round; median of all rounds with a bootstrap 95% CI "
                      "resampling pairs of processes",
            "rows": rows}
    for row in rows:
        for workload, out in row["workloads"].items():
            goal = GOALS["overhead" if row["active"] == row["pool"] else "fidelity"]
            lo, hi = out["wall"]["ci95"]
            print(f"N={row['active']}/{row['pool']} {workload}: median {out['wall']['median']:.3f} "
                  f"(95% CI {lo:.3f}-{hi:.3f}), goal {goal}")
    save("fidelity", data)
    plot(data)


def plot(data: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    width = 0.8 / len(WORKLOADS)
    for i, w in enumerate(WORKLOADS):
        xs = [row["active"] + (i - (len(WORKLOADS) - 1) / 2) * width for row in rows]
        meds = [row["workloads"][w]["wall"]["median"] for row in rows]
        err = [[m - row["workloads"][w]["wall"]["ci95"][0] for m, row in zip(meds, rows)],
               [row["workloads"][w]["wall"]["ci95"][1] - m for m, row in zip(meds, rows)]]
        ax.bar(xs, meds, width, label=w, yerr=err, capsize=4)
        for row, x in zip(rows, xs):
            rs = row["workloads"][w]["wall"]["pair_medians"]
            ax.plot([x] * len(rs), rs, "k.", ms=3, alpha=0.6)
    ax.axhline(GOALS["fidelity"], color="r", ls="--", lw=1, label="fidelity goal 0.95")
    ax.axhline(GOALS["overhead"], color="m", ls=":", lw=1, label="overhead goal 0.98 (N = M)")
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set_xticks([row["active"] for row in rows])
    ax.set_xlabel(f"active threads N (pool M = {rows[0]['pool']})")
    ax.set_ylabel("steps/s malleable / plain TF with N threads")
    ax.set_title(f"Thread parking fidelity, interleaved bursts, {data['pairs']} process pairs\n"
                 "(bars: median ratio, 95% CI over pairs; dots: pair medians)", fontsize=10)
    top = max(r for row in rows for w in WORKLOADS
              for r in row["workloads"][w]["wall"]["pair_medians"] + row["workloads"][w]["wall"]["ci95"])
    ax.set_ylim(0.6, max(1.3, top) + 0.15)
    ax.legend(fontsize=7, loc="upper center", ncol=3)
    fig.tight_layout()
    out = os.path.join(os.path.dirname(__file__), "results", "fidelity.png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
