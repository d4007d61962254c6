"""At cluster scale, how far can the policies cut makespan, and how far could any schedule?

The issue's goal (throughput 25% under static's makespan, within 10% of the fluid bound) is a
property of the workload as much as of the policy: where one long job sets the makespan, the
bound itself is barely below static. This sweeps the offered load of the generated workload
(runtimes capped at ``--max-runtime-h``) and reports, per load, static's makespan, the fluid
lower bound and each policy's makespan and mean completion, with malleable jobs asking Slurm
for ``--ask`` of their cores (static jobs ask for their size, as plain TensorFlow users do).

    python benchmarks/simulate_load_sweep.py [--nodes 1000 --cores 64 --jobs 50000]
        [--loads 1.2,2,3,4] [--seeds 1] [--ask 0.25]

Writes benchmarks/results/simulate_load_sweep.json and .png.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import RESULTS, machine, save  # noqa: E402

from slurm_plugin.simulator import SimPolicy, Simulation, WorkloadModel, generate  # noqa: E402

POLICIES = (SimPolicy.STATIC, SimPolicy.LEND_IDLE, SimPolicy.THROUGHPUT)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    seeds = sorted({r["seed"] for r in rows})
    for seed in seeds:
        rs = sorted((r for r in rows if r["seed"] == seed), key=lambda r: r["offered_load"])
        loads = [r["offered_load"] for r in rs]
        axes[0].plot(loads, [r["lower_bound_makespan_s"] / r["static"]["makespan_s"] for r in rs],
                     "k--", marker="x", label="fluid lower bound" if seed == seeds[0] else None)
        for p in POLICIES[1:]:
            axes[0].plot(loads, [r[p.value]["makespan_s"] / r["static"]["makespan_s"] for r in rs],
                         marker="o", label=p.value if seed == seeds[0] else None,
                         color="C0" if p is SimPolicy.LEND_IDLE else "C1")
            axes[1].plot(loads, [r[p.value]["mean_completion_s"] / r["static"]["mean_completion_s"]
                                 for r in rs], marker="o",
                         label=p.value if seed == seeds[0] else None,
                         color="C0" if p is SimPolicy.LEND_IDLE else "C1")
    axes[0].axhline(0.75, color="grey", lw=0.8, ls=":", label="goal: 0.75 of static")
    axes[0].set_ylabel("makespan / static's")
    axes[1].set_ylabel("mean completion / static's")
    for ax in axes:
        ax.set_xlabel("offered load")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.legend(fontsize=7)
    fig.suptitle(f"{rows[0]['nodes']} nodes x {rows[0]['cores']} cores, {rows[0]['jobs']} jobs, "
                 f"half malleable asking {rows[0]['malleable_ask']} of their cores", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--cores", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--malleable-fraction", type=float, default=0.5)
    ap.add_argument("--ask", type=float, default=0.25)
    ap.add_argument("--loads", default="1.2,2,3,4")
    ap.add_argument("--max-runtime-h", type=float, default=4.0)
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--name", default="simulate_load_sweep")
    args = ap.parse_args()
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for load in (float(x) for x in args.loads.split(",")):
            model = WorkloadModel(offered_load=load, runtime_max_s=args.max_runtime_h * 3600.0)
            jobs = generate(args.jobs, args.nodes, args.cores, args.malleable_fraction, seed,
                            model)
            row: dict = {"seed": seed, "offered_load": load, "nodes": args.nodes,
                         "cores": args.cores, "jobs": args.jobs, "malleable_ask": args.ask}
            for policy in POLICIES:
                r = Simulation(policy.submitted(jobs, args.ask), nodes=args.nodes,
                               cores=args.cores, policy=policy).run()
                row["lower_bound_makespan_s"] = r.lower_bound_makespan_s
                row[policy.value] = {k: round(v, 3) if isinstance(v, float) else v
                                     for k, v in r.summary().items()
                                     if k in ("makespan_s", "mean_completion_s", "utilisation",
                                              "resizes", "wall_s")}
            st = row["static"]["makespan_s"]
            row["bound_vs_static"] = round(row["lower_bound_makespan_s"] / st, 3)
            for p in POLICIES[1:]:
                row[p.value]["makespan_vs_static"] = round(row[p.value]["makespan_s"] / st, 3)
                row[p.value]["makespan_vs_bound"] = round(
                    row[p.value]["makespan_s"] / row["lower_bound_makespan_s"], 3)
                row[p.value]["mean_completion_vs_static"] = round(
                    row[p.value]["mean_completion_s"] / row["static"]["mean_completion_s"], 3)
            rows.append(row)
            print(f"seed {seed} load {load}: bound/static {row['bound_vs_static']}  " + "  ".join(
                f"{p.value} {row[p.value]['makespan_vs_static']} (bound x"
                f"{row[p.value]['makespan_vs_bound']}, mean completion "
                f"{row[p.value]['mean_completion_vs_static']})" for p in POLICIES[1:]), flush=True)
    save(args.name, {"benchmark": "makespan against offered load, simulated at scale",
                     "machine": machine(), "max_runtime_h": args.max_runtime_h,
                     "malleable_fraction": args.malleable_fraction, "rows": rows})
    png = RESULTS / f"{args.name}.png"
    plot(rows, png)
    print("wrote", png)


if __name__ == "__main__":
    main()
