"""How much a trace's results depend on Slurm's bf_window: every regime of simulator/goals.py on
one trace at offered load 0.85, with backfill planning a day ahead (Slurm's default), two days,
the trace's longest time limit (what Slurm's documentation asks a site to set at least) and
without a horizon (the stand-in before bf_window was modelled).

    python -m benchmarks.simulator.bf_window [--trace KTH-SP2-1996-2.1-cln.swf.gz] [--jobs 3000]
        [--windows 1440,2880,longest,none] [--name simulate_bf_window]

Writes benchmarks/results/NAME.json: per window, simulate_goals.run_all's rows (each regime's
metrics, its ratios against static and against the regime with the same asks and no agent).
"""
from __future__ import annotations

import argparse
import math

from benchmarks.common import machine, save, trace_workload
from benchmarks.simulator.goals import run_all

from malleable_sim.lublin import scale_to_load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="KTH-SP2-1996-2.1-cln.swf.gz")
    ap.add_argument("--jobs", type=int, default=3000, help="the trace's first job lines")
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--ask", type=float, default=0.25)
    ap.add_argument("--windows", default="1440,2880,longest,none",
                    help="bf_window values in minutes; longest: the trace's longest time limit; "
                         "none: no horizon")
    ap.add_argument("--name", default="simulate_bf_window")
    args = ap.parse_args()
    # Round 2's speedup model, as its results in docs/evaluation.md were computed.
    wl, nodes, cores = trace_workload(args.trace, first=args.jobs, malleable_fraction=0.5,
                                      speedup="round2")
    jobs = scale_to_load(wl.jobs, args.load, nodes * cores)
    longest_min = math.ceil(max(j.time_limit_s or 0.0 for j in jobs) / 60)
    runs = []
    for w in args.windows.split(","):
        minutes = longest_min if w == "longest" else math.inf if w == "none" else float(w)
        print(f"{args.trace}: bf_window {minutes} min", flush=True)
        rows = run_all(jobs, nodes, cores, args.ask, backfill_window_s=minutes * 60.0)
        runs.append({"window": w, "bf_window_min": None if math.isinf(minutes) else minutes,
                     "regimes": rows})
    save(args.name, {"benchmark": "simulate_goals' regimes against Slurm's bf_window",
                     "machine": machine(), "trace": args.trace, "jobs": len(jobs),
                     "nodes": nodes, "cores": cores, "offered_load": args.load,
                     "malleable_ask": args.ask, "longest_time_limit_min": longest_min,
                     "runs": runs})
    # Per window: static's bounded slowdown, each other regime's bounded slowdown and response
    # over static's.
    print(f"{'bf_window':>10s} " + " ".join(f"{p:>22s}" for p in runs[0]["regimes"]))
    for run in runs:
        cells = []
        for r in run["regimes"].values():
            vs = r.get("vs_static")
            cells.append(f"bsld {vs['mean_bounded_slowdown']:.3f} resp {vs['mean_response_s']:.3f}"
                         if vs else f"bsld {r['mean_bounded_slowdown']:.1f}")
        print(f"{run['window']:>10s} " + " ".join(f"{c:>22s}" for c in cells))


if __name__ == "__main__":
    main()
