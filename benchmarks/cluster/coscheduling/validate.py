"""The simulator against the real runs of run.py, on the same workload.

Each job of the reference workload becomes a SimJob: submitted when it was in the static run,
1 core, its start-up there (Slurm's dispatch, the fastest submission-to-start of the static run,
plus the job's own start to its first training step: imports, building the model; more cores do
not shorten it; a wait in the queue is the simulator's to model) and its training steps. How fast it trains is
what was measured of the program each regime runs: under static and cgroup-only the plain job's
steps/s in the static run (its threads never grow); under lend-idle and throughput the
malleable job's steps/s at 1 and 2 threads by its own telemetry (the median over the malleable
runs), so the malleable runtime's own cost is an input, not an error. Where a job never ran at
2 threads, no speedup is assumed. The simulator knows nothing of the agent's reaction time: that
shows up as the error. It (`malleable-sim`'s engine, the agent's own decide) then runs each
regime on one node of 2 cores; the error per metric is simulated / real - 1. ``--relative``
gives the earlier model for comparison: the malleable curve scaled so that 1 thread runs as
fast as the plain job.

    python -m benchmarks.cluster.coscheduling.validate [--real NAME,NAME,...] [--relative]
        [--name coscheduling_validation]

Reads benchmarks/results/NAME.json for each repetition of run.py (default: coscheduling.json and
every coscheduling_repN.json), compares each with the simulator, and pools them: the mean real
gain over static against the mean simulated gain. Writes coscheduling_validation.json
(coscheduling_validation_relative.json with --relative).
"""
from __future__ import annotations

import argparse
import json


from benchmarks.common import RESULTS, geomean_interval, save

from malleable_policy.request import MalleableSpec
from malleable_sim import Amdahl, Measured, SimJob, SimPolicy, simulate


METRICS = ("makespan_s", "mean_completion_s")


def curves(runs: list[dict]) -> dict[str, dict[int, float]]:
    """Each job's steps/s by threads, the median over the malleable runs that measured it."""
    seen: dict[str, dict[int, list[float]]] = {}
    for run in runs:
        if run["job_mode"] != "malleable":
            continue
        for name, job in run["jobs"].items():
            for k, v in job["steps_per_s_by_threads"].items():
                seen.setdefault(name, {}).setdefault(int(k), []).append(v)
    return {name: {k: sorted(v)[len(v) // 2] for k, v in pts.items()}
            for name, pts in seen.items()}


def sim_jobs(real: dict, regime: str, *, relative: bool = False) -> list[SimJob]:
    static = next(r for r in real["runs"] if r["regime"] == "static")
    measured = curves(real["runs"])
    threads_follow = SimPolicy(regime).threads_follow
    # Slurm's dispatch, submission to the script's start where a core was free at once (the
    # fastest of the static run's jobs): a job's queueing in the static run is not its start-up,
    # the simulator queues it itself.
    dispatch = min(j["start"] - j["submitted"] for j in static["jobs"].values())
    out = []
    for i, (name, job) in enumerate(sorted(static["jobs"].items()), 1):
        pts = measured.get(name, {})
        curve = Measured.from_steps_per_s(pts) if pts else Amdahl(serial=1.0)  # no speedup
        plain_s = job["end"] - job["ready"]                 # the plain job's training time
        # Measured's rate at 1 thread is 1.0: the runtime at 1 thread is steps / steps-per-s.
        runtime = job["steps"] / pts[1] if pts.get(1) and threads_follow and not relative \
            else plain_s
        spec = MalleableSpec(min_cpus=1, max_cpus=2) if job["malleable"] else None
        out.append(SimJob(i, job["submitted"], 1, runtime, curve, spec,
                          startup_s=dispatch + job["ready"] - job["start"]))
    return out


def compare(real: dict, *, relative: bool) -> dict:
    """One set of real runs against the simulator: per regime, real and simulated metrics and
    each regime's gain over static."""
    rows, jobs_by_regime = [], {}
    for run in real["runs"]:
        jobs = jobs_by_regime[run["regime"]] = sim_jobs(real, run["regime"], relative=relative)
        sim = simulate(jobs, nodes=1, cores=2, policy=SimPolicy(run["regime"]))
        row = {"regime": run["regime"]}
        for metric in ("makespan_s", "mean_completion_s", "utilisation"):
            s, r = getattr(sim, metric), run[metric]
            row[metric] = {"real": round(r, 3), "simulated": round(s, 3),
                           "error": round(s / r - 1, 3)}
        rows.append(row)
        print(f"  {run['regime']:12s} " + "  ".join(
            f"{m} real {row[m]['real']:.1f} sim {row[m]['simulated']:.1f} "
            f"({row[m]['error']:+.1%})" for m in METRICS))
    gains = {}
    static = {r["regime"]: r for r in rows}.get("static")
    if static:
        for row in rows:
            g = {}
            for metric in METRICS:
                real_gain = 1 - row[metric]["real"] / static[metric]["real"]
                sim_gain = 1 - row[metric]["simulated"] / static[metric]["simulated"]
                g[metric] = {"real": round(real_gain, 4), "simulated": round(sim_gain, 4),
                             "real / simulated": round(real_gain / sim_gain, 3)
                             if abs(sim_gain) > 1e-9 else None}
            gains[row["regime"]] = g
    return {"jobs": {regime: [{"job": j.job_id, "submit_s": j.submit_s,
                               "startup_s": round(j.startup_s, 2),
                               "runtime_s": round(j.runtime_s, 2),
                               "malleable": j.spec is not None, "curve": repr(j.speedup)}
                              for j in jobs] for regime, jobs in jobs_by_regime.items()},
            "rows": rows, "gain_vs_static": gains}


def pooled(repetitions: list[dict]) -> dict:
    """Per regime and metric: the mean real gain over the repetitions against the mean
    simulated gain (a ratio of means: one repetition's small predicted gain would make a mean of
    ratios swing), with each repetition's own ratio."""
    out: dict = {}
    for regime in ("lend-idle", "throughput"):
        for metric in METRICS:
            gs = [rep["gain_vs_static"][regime][metric] for rep in repetitions
                  if regime in rep["gain_vs_static"]]
            if not gs:
                continue
            real = sum(g["real"] for g in gs) / len(gs)
            sim = sum(g["simulated"] for g in gs) / len(gs)
            out.setdefault(regime, {})[metric] = {
                "mean real gain": round(real, 4), "mean simulated gain": round(sim, 4),
                "real / simulated": round(real / sim, 3) if abs(sim) > 1e-9 else None,
                "per repetition": [g["real / simulated"] for g in gs]}
    # Each regime's own prediction error: simulated over real, per repetition, as a geometric
    # mean with its bootstrap interval.
    for regime in {row["regime"] for rep in repetitions for row in rep["rows"]}:
        for metric in METRICS:
            ratios = [row[metric]["simulated"] / row[metric]["real"] for rep in repetitions
                      for row in rep["rows"] if row["regime"] == regime]
            out.setdefault(regime, {}).setdefault(metric, {})["simulated / real"] = \
                geomean_interval(ratios)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--real", default=None,
                    help="comma-separated names of real runs, benchmarks/results/NAME.json "
                         "(run.py --name); default: coscheduling and every coscheduling_repN")
    ap.add_argument("--name", default=None,
                    help="results as benchmarks/results/NAME.json (default: "
                         "coscheduling_validation, _relative with --relative)")
    ap.add_argument("--relative", action="store_true",
                    help="the earlier model: malleable at 1 thread as fast as plain")
    args = ap.parse_args()
    names = args.real.split(",") if args.real else ["coscheduling"] + sorted(
        p.stem for p in RESULTS.glob("coscheduling_rep*.json") if "_validation" not in p.stem)
    repetitions = []
    for name in names:
        print(name)
        rep = compare(json.loads((RESULTS / f"{name}.json").read_text()),
                      relative=args.relative)
        repetitions.append({"real": f"{name}.json", **rep})
    pool = pooled(repetitions)
    for regime, ms in pool.items():
        print(f"{regime:12s} " + "  ".join(
            f"{m}: simulated / real {v['simulated / real']['geomean']} "
            f"({v['simulated / real']['lo']}-{v['simulated / real']['hi']})"
            + (f", real gain {v['mean real gain']:.1%} / simulated {v['mean simulated gain']:.1%}"
               f" = {v['real / simulated']}" if "mean real gain" in v else "")
            for m, v in ms.items()))
    save(args.name or "coscheduling_validation" + ("_relative" if args.relative else ""), {
        "what": "the simulator on the reference workload with measured curves vs the real runs",
        "model": "relative: malleable at 1 thread as fast as plain" if args.relative else
                 "absolute: each regime's program at its measured steps/s",
        "pooled": pool, "repetitions": repetitions})


if __name__ == "__main__":
    main()
