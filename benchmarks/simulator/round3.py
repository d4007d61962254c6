"""Evaluation round 3's statistics (issue 43, item 4): every regime on random windows of each
trace, over seeds, at the window's own offered load and at 0.85, under the calibrated speedup
model (efficiency at the requested size U(0.5, 0.9)), time limits enforced, and resizes that
cost time. Each cell is a paired geometric mean over (seed, window) of a regime's metric over
its baseline's, with a bootstrap 95% interval (the pairs resampled).

    python -m benchmarks.simulator.round3 [--seeds 10] [--windows 5] [--jobs 1000]
        [--thunder-jobs 1000] [--atlas-jobs 1000] [--workers 2] [--name simulate_round3]
        [--node-costs 0,10,300] [--loads natural,0.85,closed] [--from-cache]
        [--missing-limits popular|run_time] [--reuse EARLIER.json]

A window is ``--jobs`` consecutive jobs of the trace from a random start (windows differ by
trace, not by seed); a seed draws which jobs are malleable, their speedup curves and a small
jitter of each arrival (uniform 0-60 s). ``--thunder-jobs`` and ``--atlas-jobs`` set those
traces' window lengths apart (their 1,002 and 1,152 nodes make conservative backfill's search
slow here). Every finished case is appended to NAME.cases.jsonl, so an interrupted run goes on
where it stopped; ``--from-cache`` summarises what is there. ``--reuse`` takes the cases of an
earlier run under the other ``--missing-limits`` rule where the rule changes nothing: windows in
which every job records its requested time.

The costs and bounds, stated: a core move costs ``CORE_MOVE_S`` (malleable-sim's measured
default: the slowest framework's threads following a cgroup change, rounded up), a node given or taken
``NODE_RESIZE_S`` (a checkpoint-restart or an elastic resync: the issue's middle case), and a
job that gave a node back is not given one again for ``REGROW_AFTER_S``.

Baselines: against static (every job at its size: the total effect), and each agent against the
regime without an agent whose jobs ask for the same (static-ask for lend-idle and throughput:
the agent's own effect). The moldable oracle (each malleable job fixed at its processor working
set) shows what the speedup model gives without any malleability. ``nodes`` is node-count
malleability, which the product does not do on a real cluster: potential, simulated only.

Writes benchmarks/results/NAME.json and NAME.png (bounded slowdown over the baseline, per
regime and trace, at 0.85, with intervals).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.common import PWA, RESULTS, ROUND3_TRACES, geomean_interval, machine, save
from malleable_sim.cli import CORE_MOVE_S

NODE_RESIZE_S = 60.0
REGROW_AFTER_S = 600.0
MALLEABLE_FRACTION = 0.5
MALLEABLE_ASK = 0.5
JITTER_S = 60.0
LOADS = ("natural", 0.85, "closed")     # "closed": every job submitted at 0 (a closed batch)
METRICS = ("mean_bounded_slowdown", "mean_response_s", "makespan_s",
           "wide_rigid_mean_bounded_slowdown")
WIDE_RIGID_NODES = 2     # a wide rigid job (the go/no-go rule's guardrail): rigid, on 2+ nodes


def window_starts(n_records: int, jobs: int, windows: int, trace: str) -> list[int]:
    """Where each window of ``jobs`` starts in the trace: random, fixed per trace."""
    rng = random.Random(f"round3-windows-{trace}")
    return sorted(rng.randrange(0, max(1, n_records - jobs)) for _ in range(windows))


def case_key_of(case: tuple) -> tuple:
    trace, start, jobs, seed, _window, load, node_costs, _missing = case
    return (trace, start, jobs, seed, str(load), tuple(node_costs))


def case_key(result: dict) -> tuple:
    return (result["trace"], result["window_start"], result["jobs_window"], result["seed"],
            str(result["load"]), tuple(result["node_costs"]))


@functools.lru_cache(maxsize=None)
def trace_log(trace: str):
    """A trace's log, read once per process (every case of a trace is a window of it)."""
    from malleable_sim import read_swf
    return read_swf((PWA / trace).read_bytes())


def trace_window(trace: str, start: int, jobs: int) -> tuple:
    """The log's ``jobs`` records from ``start``, and the trace's nodes and cores."""
    nodes, cores = next((n, c) for t, n, c in ROUND3_TRACES if t == trace)
    log = trace_log(trace)
    return dataclasses.replace(log, records=log.records[start:start + jobs]), nodes, cores


def limits_all_requested(trace: str, start: int, jobs: int) -> bool:
    """Whether every job of a window records its requested time, so that no
    ``--missing-limits`` rule changes any of its cases."""
    from malleable_sim import Adjustment, swf_workload
    window, nodes, cores = trace_window(trace, start, jobs)
    adjusted = swf_workload(window, nodes=nodes, cores=cores).adjusted
    return adjusted[Adjustment.TIME_LIMIT_FROM_RUNTIME.value] == 0


def reusable(earlier: list[dict], missing: str) -> list[dict]:
    """An earlier run's cases that are this run's too: the same case under the same rule, or
    under another rule in a window where every job records its requested time."""
    untouched: dict[tuple, bool] = {}
    out = []
    for c in earlier:
        if c.get("missing_limit", "run_time") != missing:
            window = (c["trace"], c["window_start"], c["jobs_window"])
            if window not in untouched:
                untouched[window] = limits_all_requested(*window)
            if not untouched[window]:
                continue
        out.append({**c, "missing_limit": missing})
    return out


def case_jobs(case: tuple) -> tuple[list, int, int, float]:
    """One case's jobs as submitted (the window, its seed's malleable jobs, speedups and
    jitter, brought to its load), the trace's nodes and cores, and the window's natural load.
    Its last field: the limit of a job that requested no time (a MissingLimit value)."""
    from malleable_sim import MissingLimit, SpeedupModel, closed_batch, swf_workload
    from malleable_sim.lublin import offered_load, scale_to_load
    trace, start, jobs, seed, _window, load, _node_costs, missing = case
    log, nodes, cores = trace_window(trace, start, jobs)
    w = swf_workload(log, nodes=nodes, cores=cores, malleable_fraction=MALLEABLE_FRACTION,
                     seed=seed, speedup=SpeedupModel.CALIBRATED,
                     missing_limit=MissingLimit(missing))
    rng = random.Random(f"round3-jitter-{seed}")
    first = min(j.submit_s for j in w.jobs)
    submitted = [dataclasses.replace(j, submit_s=j.submit_s - first + rng.uniform(0, JITTER_S))
                 for j in w.jobs]
    natural = offered_load(submitted, nodes * cores)
    if load == "closed":
        submitted = closed_batch(submitted)
    elif load != "natural":
        submitted = scale_to_load(submitted, float(load), nodes * cores)
    return submitted, nodes, cores, natural


def conditions(node_cost: float = NODE_RESIZE_S) -> dict:
    """Round 3's limits, costs and hysteresis, as Simulation's keyword arguments."""
    from malleable_sim import NodeBounds, ResizeCosts, TimeLimits
    return {"time_limits": TimeLimits.ENFORCED,
            "resize_costs": ResizeCosts(node_s=node_cost, core_s=CORE_MOVE_S),
            "node_bounds": NodeBounds(regrow_after_s=REGROW_AFTER_S)}


def run_regime(submitted: list, nodes: int, cores: int, policy, node_cost: float) -> dict:
    """One regime on a case's jobs: the metrics round 3 keeps, its kills and resizes."""
    from malleable_sim import Simulation
    from malleable_sim.metrics import bounded_slowdown
    t0 = time.monotonic()
    r = Simulation(policy.submitted(submitted, MALLEABLE_ASK, cores), nodes=nodes,
                   cores=cores, policy=policy, **conditions(node_cost)).run()
    s = r.summary()
    wide = [j for j in r.per_job if not j.malleable and j.nodes >= WIDE_RIGID_NODES]
    s["wide_rigid_mean_bounded_slowdown"] = sum(
        bounded_slowdown(j.counted_response_s, j.reference_s) for j in wide) / len(wide) \
        if wide else 0.0
    return {**{m: s[m] for m in METRICS}, "timed_out_jobs": s.get("timed_out_jobs"),
            "resizes": s["resizes"], "wall_s": round(time.monotonic() - t0, 2)}


def one_case(case: tuple) -> dict:
    """Every regime on one (trace, window, seed, load): the same jobs, paired; at 0.85 also
    ``nodes`` at each of the case's other node resize costs (``nodes@COSTs``)."""
    from malleable_sim import SimPolicy, efficiency_at_request
    trace, start, jobs, seed, _window, load, node_costs, missing = case
    submitted, nodes, cores, natural = case_jobs(case)
    out = {"trace": trace, "window_start": start, "jobs_window": jobs, "seed": seed,
           "load": load, "node_costs": list(node_costs), "missing_limit": missing,
           "natural_load": round(natural, 4), "jobs": len(submitted),
           "efficiency_at_request": round(efficiency_at_request(submitted), 4), "regimes": {}}
    runs = [(p.value, p, NODE_RESIZE_S) for p in SimPolicy
            if p is not SimPolicy.CGROUP_ONLY]   # threads fixed at start: not a product regime
    if load == 0.85:
        runs += [(f"nodes@{c:g}s", SimPolicy.NODES, c) for c in node_costs
                 if c != NODE_RESIZE_S]
    for label, policy, node_cost in runs:
        out["regimes"][label] = run_regime(submitted, nodes, cores, policy, node_cost)
    return out


def summarise(cases: list[dict]) -> dict:
    """Per trace and load: each regime over static, and each agent over its same-asks
    baseline, per metric: geometric mean with its interval."""
    from malleable_sim import SimPolicy
    table: dict = {}
    for key in sorted({(c["trace"], str(c["load"])) for c in cases}):
        rows = [c for c in cases if (c["trace"], str(c["load"])) == key]
        cell: dict = {"pairs": len(rows),
                      "efficiency_at_request": geomean_interval(
                          [c["efficiency_at_request"] for c in rows]),
                      "natural_load": geomean_interval([c["natural_load"] for c in rows])}
        # The share of jobs killed at their time limit, per regime (mean over the pairs): a
        # cost the ratios above count only as a rerun.
        cell["timed_out_share"] = {
            name: round(sum((c["regimes"][name]["timed_out_jobs"] or 0) / c["jobs"]
                            for c in rows) / len(rows), 5) for name in rows[0]["regimes"]}
        for name in rows[0]["regimes"]:
            policy = SimPolicy(name.split("@")[0])
            if policy is SimPolicy.STATIC:
                continue
            for label, base in (("vs_static", SimPolicy.STATIC),
                                ("own_effect", policy.same_asks_baseline)):
                if base is None or base.value not in rows[0]["regimes"]:
                    continue
                cell.setdefault(name, {})[label] = {
                    m: geomean_interval([c["regimes"][name][m] /
                                         c["regimes"][base.value][m] for c in rows
                                         if c["regimes"][base.value][m] > 0])
                    for m in METRICS}
        table.setdefault(key[0], {})[key[1]] = cell
    return table


GO_TRACES = ("NASA-iPSC-1993-3.1-cln.swf.gz", "KTH-SP2-1996-2.1-cln.swf.gz",
             "LLNL-Thunder-2007-1.1-cln.swf.gz")     # the rule's three (issue 43, item 9)


def go_no_go(table: dict) -> dict:
    """Issue 43's rule for building node-count malleability live, under this run's calibrated
    speedups and node resize cost: go only if ``nodes`` reaches a geometric-mean bounded
    slowdown <= 0.8 with the interval's upper end below 1 on at least 2 of the 3 traces (at
    0.85), keeps wide rigid jobs' bounded slowdown <= 1.10 of static, and does not worsen
    closed-batch response (its geometric mean <= 1)."""
    per_trace = {}
    for trace in GO_TRACES:
        loads = table.get(trace, {})
        open_, closed = loads.get("0.85", {}).get("nodes"), loads.get("closed", {}).get("nodes")
        if not open_ or not closed:
            continue
        bsld = open_["vs_static"]["mean_bounded_slowdown"]
        wide = open_["vs_static"]["wide_rigid_mean_bounded_slowdown"]
        resp = closed["vs_static"]["mean_response_s"]
        per_trace[trace] = {
            "bsld": bsld, "wide_rigid_bsld": wide, "closed_response": resp,
            "bsld_met": bsld["geomean"] is not None and bsld["geomean"] <= 0.8 and
            bsld["hi"] < 1.0,
            "wide_rigid_met": wide["geomean"] is None or wide["geomean"] <= 1.10,
            "closed_response_met": resp["geomean"] is not None and resp["geomean"] <= 1.0}
    met = sum(t["bsld_met"] for t in per_trace.values())
    go = met >= 2 and all(t["wide_rigid_met"] and t["closed_response_met"]
                          for t in per_trace.values())
    return {"go": go, "traces_meeting_bsld": met, "per_trace": per_trace}


def plot(table: dict, png) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    traces = sorted(table)
    fig, axes = plt.subplots(1, len(traces), figsize=(4.2 * len(traces), 3.6), squeeze=False)
    for ax, trace in zip(axes[0], traces):
        cell = table[trace].get("0.85", {})
        bars = [(f"{p}\n{'own' if k == 'own_effect' else 'total'}", v["mean_bounded_slowdown"])
                for p, row in cell.items() if isinstance(row, dict) and "vs_static" in row
                for k, v in row.items() if k in ("vs_static", "own_effect")
                and not (p in ("nodes", "moldable", "static-ask") and k == "own_effect")]
        for i, (label, v) in enumerate(bars):
            if v["geomean"] is None:
                continue
            ax.bar(i, v["geomean"], color="C0" if "own" in label else "C7")
            ax.errorbar(i, v["geomean"], yerr=[[v["geomean"] - v["lo"]], [v["hi"] - v["geomean"]]],
                        color="k", capsize=3)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(0.8, color="g", lw=0.8, ls="--")
        ax.set_xticks(range(len(bars)))
        ax.set_xticklabels([b[0] for b in bars], fontsize=6, rotation=60)
        ax.set_title(f"{trace.split('-')[0]} {trace.split('-')[1]} (load 0.85)", fontsize=9)
        ax.set_ylabel("mean bounded slowdown / baseline")
    fig.suptitle("Round 3: geometric mean over seeds x windows, bootstrap 95% intervals "
                 "(own: against the same asks without an agent)", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--thunder-jobs", type=int, default=1000)
    ap.add_argument("--traces", default=",".join(t for t, _, _ in ROUND3_TRACES))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--name", default="simulate_round3")
    ap.add_argument("--loads", default=",".join(map(str, LOADS)),
                    help="natural, closed and/or offered loads (comma-separated)")
    ap.add_argument("--node-costs", default="",
                    help="at 0.85, nodes also at these node resize costs (seconds, comma-separated)")
    ap.add_argument("--from-cache", action="store_true",
                    help="summarise the cases RESULTS/NAME.cases.jsonl holds, simulating nothing")
    ap.add_argument("--atlas-jobs", type=int, default=1000,
                    help="jobs per window of LLNL Atlas (1,152 nodes: the slowest here)")
    ap.add_argument("--missing-limits", default="popular", choices=("popular", "run_time"),
                    help="the time limit of a job whose log records none (NASA's, two thirds "
                         "of Thunder's, a sixth of Atlas's): the popular limit it fits in "
                         "(malleable_sim.workload.limit_users_would_ask), or its run time "
                         "exactly (round 3's first run); give each its own --name")
    ap.add_argument("--reuse", action="append", default=[], metavar="EARLIER.json",
                    help="take an earlier run's cases where they are this run's (the same "
                         "case, under this rule or in a window the rule does not touch)")
    args = ap.parse_args(argv)
    node_costs = tuple(float(c) for c in args.node_costs.split(",") if c)
    loads = [x if x in ("natural", "closed") else float(x) for x in args.loads.split(",")]
    cases = []
    for trace in args.traces.split(","):
        jobs = args.thunder_jobs if "Thunder" in trace else \
            args.atlas_jobs if "Atlas" in trace else args.jobs
        n = len(trace_log(trace).records)
        for window, start in enumerate(window_starts(n, jobs, args.windows, trace)):
            for seed in range(1, args.seeds + 1):
                for load in loads:
                    cases.append((trace, start, jobs, seed, window, load, node_costs,
                                  args.missing_limits))
    # Each finished case is kept (one JSON line) as it comes: a run cut short goes on where it
    # stopped, and --from-cache summarises what is there.
    cache = RESULTS / f"{args.name}.cases.jsonl"
    done = [json.loads(line) for line in cache.read_text().splitlines()] \
        if cache.exists() else []
    have = {case_key(c) for c in done}
    wanted = {case_key_of(c) for c in cases}
    reused = []
    for path in args.reuse:
        for c in reusable(json.loads(Path(path).read_text())["cases"], args.missing_limits):
            if case_key(c) in wanted and case_key(c) not in have:
                have.add(case_key(c))
                reused.append(c)
    with cache.open("a") as out:
        out.writelines(json.dumps(c) + "\n" for c in reused)
    done += reused
    todo = [c for c in cases if case_key_of(c) not in have]
    if args.from_cache:
        todo = []
    t0 = time.monotonic()
    print(f"{len(done)} cases cached or reused, {len(todo)} to run", flush=True)
    # The workers run at the lowest priority, beside anything else on a shared machine.
    with ProcessPoolExecutor(args.workers, initializer=os.nice, initargs=(19,)) as pool, \
            cache.open("a") as out:
        for i, result in enumerate(pool.map(one_case, todo), 1):
            done.append(result)
            out.write(json.dumps(result) + "\n")
            out.flush()
            if i % 10 == 0 or i == len(todo):
                print(f"{i}/{len(todo)} cases, {time.monotonic() - t0:.0f} s", flush=True)
    report(args.name, {
        "benchmark": "evaluation round 3: regimes on random trace windows over seeds, paired "
                     "geometric means with bootstrap 95% intervals",
        "machine": machine(), "seeds": args.seeds, "windows": args.windows,
        "jobs_per_window": args.jobs, "thunder_jobs_per_window": args.thunder_jobs,
        "atlas_jobs_per_window": args.atlas_jobs,
        "speedup_model": "calibrated", "time_limits": "enforced",
        "missing_time_limits": args.missing_limits,
        "core_move_s": CORE_MOVE_S, "node_resize_s": NODE_RESIZE_S,
        "regrow_after_s": REGROW_AFTER_S, "malleable_fraction": MALLEABLE_FRACTION,
        "malleable_ask": MALLEABLE_ASK, "arrival_jitter_s": JITTER_S,
        "node_costs_s": list(node_costs), "wall_s": round(time.monotonic() - t0, 1)}, done)


def report(name: str, about: dict, done: list[dict]) -> None:
    """The summary, the go/no-go decision, the JSON and the picture, printed in short."""
    table = summarise(done)
    decision = go_no_go(table)
    save(name, {**about, "summary": table, "node_count_go_no_go": decision, "cases": done})
    plot(table, RESULTS / f"{name}.png")
    for trace, loads in table.items():
        for load, cell in loads.items():
            print(trace, load, "eff", cell["efficiency_at_request"]["geomean"],
                  "killed", cell["timed_out_share"])
            for p, row in cell.items():
                if isinstance(row, dict) and "vs_static" in row:
                    for k, v in row.items():
                        b = v["mean_bounded_slowdown"]
                        print(f"  {p:11s} {k:10s} bsld {b['geomean']} [{b['lo']}, {b['hi']}]")
    print("node-count malleability live:", "GO" if decision["go"] else "NO-GO",
          f"({decision['traces_meeting_bsld']} of 3 traces meet the slowdown bar)")


if __name__ == "__main__":
    main()
