"""At cluster scale, how far can the policies cut makespan, and how far could any schedule?

The issue's goal (throughput 25% under static's makespan, within 10% of the fluid bound) is a
property of the workload and of Slurm's queue as much as of the policy: where one long job sets
the makespan, the bound itself is barely below static, and where the queue is first come, first
served, a long job submitted late waits behind the backlog in every regime. This sweeps the
offered load of the generated workload (runtimes capped at ``--max-runtime-h``), Slurm's queue
order (``--orders``: the same order in every regime, static included) and the share of its cores
a malleable job asks Slurm for (``--asks``; static jobs ask for their size, as plain TensorFlow
users do), and reports static's makespan, the fluid lower bound and each policy's makespan and
mean response.

    python -m benchmarks.simulator.load_sweep [--nodes 1000 --cores 64 --jobs 50000]
        [--loads 1.2,2,3,4] [--seeds 1] [--asks 0.25] [--orders fcfs] [--name NAME]
        [--workload project|lublin]

``--workload lublin``: Lublin and Feitelson's published fits with Downey speedup curves
(``simulator.lublin``), its inter-arrival times scaled to each offered load (``--max-runtime-h``
does not apply: the model caps runtimes at exp(12) s). The nodes regime (node-count
malleability) is reported beside lend-idle and throughput.

Writes benchmarks/results/NAME.json and .png (makespan against load for the first order and
ask; with several orders, bars per order for each load instead).
"""
from __future__ import annotations

import argparse
from pathlib import Path


from benchmarks.common import RESULTS, machine, save

from malleable_sim import (QueueOrder, SimPolicy, Simulation, SpeedupModel, WorkloadModel,
                           generate, generate_lublin)

POLICIES = (SimPolicy.STATIC, SimPolicy.LEND_IDLE, SimPolicy.THROUGHPUT, SimPolicy.NODES)
KEPT = ("makespan_s", "mean_response_s", "p95_wait_s", "mean_bounded_slowdown", "utilisation",
        "resizes", "wall_s")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    rows = [r for r in rows if r["queue_order"] == rows[0]["queue_order"]
            and r["malleable_ask"] == rows[0]["malleable_ask"]]
    seeds = sorted({r["seed"] for r in rows})
    for seed in seeds:
        rs = sorted((r for r in rows if r["seed"] == seed), key=lambda r: r["offered_load"])
        loads = [r["offered_load"] for r in rs]
        axes[0].plot(loads, [r["lower_bound_makespan_s"] / r["static"]["makespan_s"] for r in rs],
                     "k--", marker="x", label="fluid lower bound" if seed == seeds[0] else None)
        for p in POLICIES[1:]:
            axes[0].plot(loads, [r[p.value]["makespan_s"] / r["static"]["makespan_s"] for r in rs],
                         marker="o", label=p.value if seed == seeds[0] else None,
                         color=f"C{POLICIES.index(p) - 1}")
            axes[1].plot(loads, [r[p.value]["mean_response_s"] / r["static"]["mean_response_s"]
                                 for r in rs], marker="o",
                         label=p.value if seed == seeds[0] else None,
                         color=f"C{POLICIES.index(p) - 1}")
    axes[0].axhline(0.75, color="grey", lw=0.8, ls=":", label="goal: 0.75 of static")
    axes[0].set_ylabel("makespan / static's")
    axes[1].set_ylabel("mean response / static's")
    for ax in axes:
        ax.set_xlabel("offered load")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.legend(fontsize=7)
    fig.suptitle(f"{rows[0]['nodes']} nodes x {rows[0]['cores']} cores, {rows[0]['jobs']} jobs, "
                 f"half malleable asking {rows[0]['malleable_ask']} of their cores, queue "
                 f"{rows[0]['queue_order']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_orders(rows: list[dict], path: Path) -> None:
    """Per load (seed 1): for each queue order, static and each policy at each ask, against
    first come, first served static (Slurm's default), with the fluid bound as a line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r["seed"] == rows[0]["seed"]]
    loads = sorted({r["offered_load"] for r in rows})
    orders = list(dict.fromkeys(r["queue_order"] for r in rows))
    asks = sorted({r["malleable_ask"] for r in rows})
    bars = [("static", None)] + [(p.value, a) for p in POLICIES[1:] for a in asks]
    fig, axes = plt.subplots(2, len(loads), figsize=(4.6 * len(loads), 6.4), squeeze=False)
    width = 0.8 / len(bars)
    for col, load in enumerate(loads):
        at = {(r["queue_order"], r["malleable_ask"]): r for r in rows if r["offered_load"] == load}
        ref = at[("fcfs", asks[0])]["static"] if ("fcfs", asks[0]) in at else \
            at[(orders[0], asks[0])]["static"]
        for row, metric in enumerate(("makespan_s", "mean_response_s")):
            ax = axes[row][col]
            for b, (name, ask) in enumerate(bars):
                vals = [at[(o, ask if ask is not None else asks[0])][name][metric] / ref[metric]
                        for o in orders]
                ax.bar([i + b * width for i in range(len(orders))], vals, width,
                       label=name if ask is None else f"{name}, ask {ask}", color=f"C{b}")
            if metric == "makespan_s":
                for i, o in enumerate(orders):
                    bound = at[(o, asks[0])]["lower_bound_makespan_s"] / ref[metric]
                    ax.hlines(bound, i - width / 2, i + 0.8 - width / 2, colors="k",
                              linestyles="--", label="fluid bound" if i == 0 else None)
                ax.axhline(0.75, color="grey", lw=0.8, ls=":", label="goal: 0.75")
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(orders))], orders, fontsize=8)
            ax.set_ylabel(("makespan" if row == 0 else "mean response") +
                          " / fcfs static's")
            ax.set_title(f"offered load {load}", fontsize=9)
            ax.axhline(1.0, color="grey", lw=0.8)
        axes[0][col].legend(fontsize=6)
    fig.suptitle(f"{rows[0]['nodes']} nodes x {rows[0]['cores']} cores, {rows[0]['jobs']} jobs, "
                 "half malleable; Slurm's queue order in every regime", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summarise(r) -> dict:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in r.summary().items()
            if k in KEPT}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--cores", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--malleable-fraction", type=float, default=0.5)
    ap.add_argument("--asks", default="0.25", help="shares malleable jobs ask for, comma list")
    ap.add_argument("--loads", default="1.2,2,3,4")
    ap.add_argument("--orders", default="fcfs",
                    help="Slurm's queue orders, comma list: " +
                         ", ".join(o.value for o in QueueOrder))
    ap.add_argument("--max-runtime-h", type=float, default=4.0)
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--name", default="simulate_load_sweep")
    ap.add_argument("--workload", default="project", choices=["project", "lublin"],
                    help="this project's generated model, or Lublin-Feitelson with Downey")
    args = ap.parse_args()
    asks = [float(a) for a in args.asks.split(",")]
    orders = [QueueOrder(o) for o in args.orders.split(",")]
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for load in (float(x) for x in args.loads.split(",")):
            if args.workload == "lublin":
                jobs = generate_lublin(args.jobs, args.nodes, args.cores,
                                       args.malleable_fraction, seed, offered=load)
            else:
                model = WorkloadModel(offered_load=load,
                                      runtime_max_s=args.max_runtime_h * 3600.0)
                # Round 2's speedup model, as its results in docs/evaluation.md were computed.
                jobs = generate(args.jobs, args.nodes, args.cores, args.malleable_fraction,
                                seed, model, SpeedupModel.ROUND2)
            for order in orders:
                # Static jobs ask for their size whatever the ask: one run serves every ask.
                static = Simulation(jobs, nodes=args.nodes, cores=args.cores,
                                    policy=SimPolicy.STATIC, queue_order=order).run()
                for ask in asks:
                    row: dict = {"seed": seed, "offered_load": load, "queue_order": order.value,
                                 "nodes": args.nodes, "cores": args.cores, "jobs": args.jobs,
                                 "malleable_ask": ask,
                                 "lower_bound_makespan_s": round(static.lower_bound_makespan_s, 3),
                                 "static": summarise(static)}
                    for policy in POLICIES[1:]:
                        row[policy.value] = summarise(Simulation(
                            policy.submitted(jobs, ask, args.cores), nodes=args.nodes,
                            cores=args.cores, policy=policy, queue_order=order).run())
                    # The same asks without an agent: the agent's own effect is against it.
                    row[SimPolicy.STATIC_ASK.value] = summarise(Simulation(
                        SimPolicy.STATIC_ASK.submitted(jobs, ask, args.cores), nodes=args.nodes,
                        cores=args.cores, policy=SimPolicy.STATIC_ASK, queue_order=order).run())
                    st = row["static"]["makespan_s"]
                    row["bound_vs_static"] = round(row["lower_bound_makespan_s"] / st, 3)
                    for p in POLICIES[1:]:
                        r = row[p.value]
                        r["makespan_vs_static"] = round(r["makespan_s"] / st, 3)
                        r["makespan_vs_bound"] = round(r["makespan_s"] /
                                                       row["lower_bound_makespan_s"], 3)
                        r["mean_response_vs_static"] = round(
                            r["mean_response_s"] / row["static"]["mean_response_s"], 3)
                        r["mean_response_vs_static_ask"] = round(
                            r["mean_response_s"] / row["static-ask"]["mean_response_s"], 3)
                    rows.append(row)
                    print(f"seed {seed} load {load} {order.value} ask {ask}: static "
                          f"{st:.0f} s, bound/static {row['bound_vs_static']}  " + "  ".join(
                              f"{p.value} {row[p.value]['makespan_vs_static']} (bound x"
                              f"{row[p.value]['makespan_vs_bound']}, mean response "
                              f"{row[p.value]['mean_response_vs_static']})"
                              for p in POLICIES[1:]), flush=True)
    save(args.name, {"benchmark": "makespan against offered load and queue order, simulated "
                                  "at scale", "machine": machine(), "workload": args.workload,
                     "max_runtime_h": args.max_runtime_h,
                     "malleable_fraction": args.malleable_fraction, "rows": rows})
    png = RESULTS / f"{args.name}.png"
    (plot_orders if len(orders) > 1 else plot)(rows, png)
    print("wrote", png)


if __name__ == "__main__":
    main()
