"""Node-count malleability against the price of a node change (issue 43, item 2: 0, 10, 60 and
300 s): round 3's cases at load 0.85 again, ``nodes`` alone at each cost, each paired with the
static run of the same (trace, window, seed) that round 3 cached. 60 s is round 3's own cost: its
cells are read from the cache, not simulated again.

    python -m benchmarks.simulator.node_cost_sweep [--costs 0,10,300] [--workers 2]
        [--round3 simulate_round3] [--name simulate_node_costs]

Reads the cases in benchmarks/results/ROUND3.json (run ``round3`` first; its ``--missing-limits``
rule carries over); writes NAME.json (per trace and cost: bounded slowdown, response and wide
rigid jobs' bounded slowdown over static, paired geometric means with bootstrap 95% intervals,
and the share of jobs killed at their limits) and NAME.png.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor

from benchmarks.common import RESULTS, geomean_interval, machine, save
from benchmarks.simulator.round3 import NODE_RESIZE_S, case_jobs, run_regime

LOAD = 0.85
METRICS = ("mean_bounded_slowdown", "mean_response_s", "wide_rigid_mean_bounded_slowdown")


def one(args: tuple) -> dict:
    case, costs = args
    from malleable_sim import SimPolicy
    submitted, nodes, cores, _ = case_jobs(case)
    return {"key": list(case[:4]), "nodes": {
        f"{c:g}": run_regime(submitted, nodes, cores, SimPolicy.NODES, c) for c in costs}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--costs", default="0,10,300")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--round3", default="simulate_round3")
    ap.add_argument("--name", default="simulate_node_costs")
    args = ap.parse_args(argv)
    costs = [float(c) for c in args.costs.split(",")]
    cached = json.loads((RESULTS / f"{args.round3}.json").read_text())["cases"]
    base = [c for c in cached if c["load"] == LOAD and not c["node_costs"]]
    cases = [((c["trace"], c["window_start"], c["jobs_window"], c["seed"], 0, LOAD, (),
               c.get("missing_limit", "run_time")), costs) for c in base]
    t0 = time.monotonic()
    with ProcessPoolExecutor(args.workers, initializer=os.nice, initargs=(19,)) as pool:
        runs = list(pool.map(one, cases))
    table: dict = {}
    for trace in sorted({c["trace"] for c in base}):
        pairs = [(c, r) for c, r in zip(base, runs) if c["trace"] == trace]
        cell: dict = {}
        for label in [f"{c:g}" for c in sorted(costs + [NODE_RESIZE_S])]:
            rows = [(c["regimes"]["static"], r["nodes"][label] if label in r["nodes"]
                     else c["regimes"]["nodes"]) for c, r in pairs]
            cell[label] = {
                **{m: geomean_interval([n[m] / s[m] for s, n in rows if s[m] > 0])
                   for m in METRICS},
                "timed_out_share": round(sum((n["timed_out_jobs"] or 0) for _, n in rows) /
                                         sum(c["jobs"] for c, _ in pairs), 5),
                "static_timed_out_share": round(sum((s["timed_out_jobs"] or 0)
                                                    for s, _ in rows) /
                                                sum(c["jobs"] for c, _ in pairs), 5)}
        table[trace] = cell
        print(trace, {k: (v["mean_bounded_slowdown"]["geomean"], v["timed_out_share"])
                      for k, v in cell.items()}, flush=True)
    save(args.name, {"benchmark": "node-count malleability against the node change's cost, "
                                  "load 0.85, paired with round 3's static runs",
                     "machine": machine(), "round3": args.round3, "costs_s": costs,
                     "round3_cost_s": NODE_RESIZE_S, "pairs": len(base), "table": table,
                     "wall_s": round(time.monotonic() - t0, 1)})
    plot(table, args.name)


def plot(table: dict, name: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for trace, cell in table.items():
        xs = [float(k) for k in cell]
        g = [cell[k]["mean_bounded_slowdown"] for k in cell]
        ax.errorbar(xs, [v["geomean"] for v in g],
                    yerr=[[v["geomean"] - v["lo"] for v in g], [v["hi"] - v["geomean"] for v in g]],
                    marker="o", capsize=3, label=trace.split("-cln")[0])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(0.8, color="grey", lw=0.8, ls="--")
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("node change cost (s)")
    ax.set_ylabel("nodes / static, mean bounded slowdown")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)


if __name__ == "__main__":
    main()
