"""What thread resizing gains over resizing the cgroup alone, per workload, side by side.

Shrink: a process started on every core with pools of M threads loses its cores down to N = 1
(its cpuset folder narrows, as `docker update --cpuset-cpus`, Kubernetes in-place resize or a
cpuset-only agent do). M/N = 2, 8 and 32: pools larger than this machine's cores emulate large
nodes. Three regimes, measured on the same N cores:

    cgroup-only   plain TensorFlow started with M intra-op and M inter-op threads; only the
                  cpuset changes
    malleable     malleable_tf with pools of M, following the cpuset down to N active threads
    started-N     plain TensorFlow started with N threads (what a restart would give)

Growth: a process started on 1 core gets a second one (cpuset 0 -> 0-1):

    cgroup-only   plain TensorFlow started with 1 thread (all it had a use for at start)
    malleable     malleable_tf with pools of 2, following the cpuset up to 2 active threads
    started-N     plain TensorFlow started with 2 threads on 2 cores

All processes of a set stay alive and take turns, idle ones stopped (SIGSTOP), so drifts of the
shared machine hit all alike; each set is started afresh ``--pairs`` times. Ratios are per round,
with a bootstrap 95% CI resampling sets.

    python -m benchmarks.framework.benefit [--pairs 3] [--rounds 3] [--seconds 1.5]

Writes benchmarks/results/benefit.json and benefit.png.
"""
from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from benchmarks.common import (RESULTS, TF_WORKER, BurstWorker, CpusetFolder, machine, median, ratio_stats, save,
                    take_turns)

WORKLOADS = ("keras_cnn", "mobilenet_v2", "tf_data")
RATIOS = (2, 8, 32)


@dataclass(frozen=True)
class Regime:
    """One process: how it starts (cpus of its folder, plain threads or malleable pool) and the
    cpus its folder gets before it measures."""
    scenario: str
    regime: str
    start_cpus: str
    end_cpus: str
    plain_threads: int | None = None
    pool: int | None = None
    expect: int | None = None

    @property
    def key(self) -> str:
        return f"{self.scenario}/{self.regime}"

    def args(self, folder: CpusetFolder) -> list[str]:
        if self.pool is None:
            mode = ["plain", "--threads", str(self.plain_threads)]
        else:
            mode = ["malleable", "--pool", str(self.pool), "--expect", str(self.expect)]
        return [TF_WORKER, *mode, "--cgroup", str(folder.path),
                "--workloads", ",".join(WORKLOADS)]


def regimes(cores: int) -> list[Regime]:
    out = [Regime("shrink", "started-N", "0", "0", plain_threads=1)]
    for r in RATIOS:
        out += [Regime(f"shrink M/N={r}", "cgroup-only", f"0-{cores - 1}", "0", plain_threads=r),
                Regime(f"shrink M/N={r}", "malleable", f"0-{cores - 1}", "0", pool=r, expect=1)]
    out += [Regime("grow 1->2", "cgroup-only", "0", "0-1", plain_threads=1),
            Regime("grow 1->2", "malleable", "0", "0-1", pool=2, expect=2),
            Regime("grow 1->2", "started-N", "0-1", "0-1", plain_threads=2)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.5)
    args = ap.parse_args()
    env = {"MALLEABLE_TF_LOG": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
    rng = random.Random(2)
    specs = regimes(2)
    rates: dict[str, list[list[dict]]] = {s.key: [] for s in specs}
    states: dict[str, dict] = {}
    for pair in range(args.pairs):
        folders = {s.key: CpusetFolder(f"benefit{i}", s.start_cpus) for i, s in enumerate(specs)}
        workers = {s.key: BurstWorker(s.args(folders[s.key]), env=env) for s in specs}
        try:
            for s in specs:
                states[s.key] = workers[s.key].start(
                    resize=lambda w, s=s: folders[s.key].set_cpus(s.end_cpus))
            for k, got in take_turns(workers, WORKLOADS, args.rounds, args.seconds, rng).items():
                rates[k].append(got)
            print(f"set {pair}: " + "; ".join(
                f"{k} " + " ".join(f"{median([r[w]['wall'] for r in rates[k][pair]]):.1f}"
                                   for w in WORKLOADS) for k in rates), flush=True)
        finally:
            for w in workers.values():
                w.close()
            for f in folders.values():
                f.remove()
    rows = []
    for scenario in dict.fromkeys(s.scenario for s in specs if s.scenario != "shrink"):
        base = "shrink/started-N" if scenario.startswith("shrink") else f"{scenario}/started-N"
        cg, mal = f"{scenario}/cgroup-only", f"{scenario}/malleable"
        for wl in WORKLOADS:
            rows.append({
                "scenario": scenario, "workload": wl,
                "steps_per_s": {name: median([r[wl]["wall"] for p in rates[key] for r in p])
                                for name, key in (("cgroup-only", cg), ("malleable", mal),
                                                  ("started-N", base))},
                "malleable / cgroup-only": ratio_stats(rates[mal], rates[cg], wl),
                "malleable / started-N": ratio_stats(rates[mal], rates[base], wl),
                "cgroup-only / started-N": ratio_stats(rates[cg], rates[base], wl)})
    data = {"benchmark": "benefit of thread resizing over cgroup-only resizing",
            "machine": machine(), "pairs": args.pairs, "rounds": args.rounds,
            "seconds_per_burst": args.seconds,
            "regimes": {s.key: {"start_cpus": s.start_cpus, "end_cpus": s.end_cpus,
                                "plain_threads": s.plain_threads, "pool": s.pool,
                                "state_when_ready": states.get(s.key)} for s in specs},
            "rows": rows}
    for row in rows:
        g = row["malleable / cgroup-only"]
        b = row["malleable / started-N"]
        print(f"{row['scenario']:15s} {row['workload']:12s} malleable/cgroup-only "
              f"{g['median']:.2f} ({g['ci95'][0]:.2f}-{g['ci95'][1]:.2f})  malleable/started-N "
              f"{b['median']:.2f} ({b['ci95'][0]:.2f}-{b['ci95'][1]:.2f})")
    save("benefit", data)
    plot(data)


def plot(data: dict) -> None:

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = data["rows"]
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(12, 4), sharey=False)
    for ax, wl in zip(axes, WORKLOADS):
        mine = {r["scenario"]: r for r in rows if r["workload"] == wl}
        xs = range(len(scenarios))
        for i, (regime, color) in enumerate((("cgroup-only", "tab:gray"),
                                             ("malleable", "tab:blue"),
                                             ("started-N", "tab:green"))):
            ax.bar([x + (i - 1) * 0.27 for x in xs],
                   [mine[s]["steps_per_s"][regime] for s in scenarios], 0.27, label=regime,
                   color=color)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([s.replace("shrink ", "shrink\n") for s in scenarios], fontsize=8)
        ax.set_title(wl, fontsize=10)
        ax.set_ylabel("steps/s (median)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Cores drop from M threads' worth to 1 (shrink) or grow 1 -> 2: "
                 "cgroup-only vs malleable_tf vs TF started for the cores it has", fontsize=10)
    fig.tight_layout()
    out = str(RESULTS / "benefit.png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
