"""The simulator's stand-in for Slurm checked against Slurm itself (issue 26, part 7).

A slice of a real trace (by default 200 consecutive jobs of the KTH SP2 log, from its 19,400th
line: a busy stretch where more than half the jobs wait) is compressed in time: submit times, run
times and requested times are all divided by one factor F, so the ratio of requested to run time
is kept. Each job is then replayed as a sleep job on a real Slurm cluster of this machine
(``slurm_plugin.cluster.local.LocalCluster``: munged, slurmctld, one slurmd per node, nodes that
declare more CPUs than exist), submitted at its compressed submit time:

    sbatch -n P -t LIMIT --wrap 'sleep S'

and the simulator's static regime runs the very same compressed jobs on the same cluster shape
with the same backfill (conservative, bf_interval, bf_max_job_test) and, by default, Slurm's
placement of ``-n P`` (``--placement slurm-tasks``: a job that no node holds now is spread over
several; ``one-node``, the simulator's earlier rule, makes it wait for one node: both are
reported, under ``by_placement``). Each job's real start
(slurmctld's log, milliseconds; its job-completion log, seconds, as a cross-check) is compared
with the simulated one.

Time limits: Slurm keeps them in whole minutes (``-t 0:20`` is rounded up to a minute). A job's
limit is its requested time (its run time where it ran longer, as the simulator's SWF reader has
it) divided by F, plus a 2 s margin for Slurm's launch (so that no sleep outlives its limit), rounded
up to whole minutes, at least one. Rounding only ever raises a limit; both Slurm and the
simulator see the same rounded limit, so it changes what the replay says about the original
trace, not the comparison. The JSON reports by how much it raised them.

The per-job error: the simulator predicts when a job starts once it is submitted, that is its
wait, so a job's error is |start_sim - start_real| over its real wait, the wait counted as at least
``--floor`` seconds (1 s: bf_interval, the granularity of Slurm's own backfill timing; without
a floor a job that did not wait, in both, would divide its launch latency by zero). The median
and p90 of that are the headline; the error over the replay's span (the real makespan) and the
absolute error are reported beside it. A second simulation, fed each job's measured submit time
and measured run time (sleep plus Slurm's launch and end overhead), separates the stand-in's
scheduling decisions from what its inputs leave out.

    python -m benchmarks.cluster.slurm_replay [--trace KTH-SP2-1996-2.1-cln] [--start 19400]
        [--jobs 200] [--factor auto|F] [--target-s 600] [--nodes 4] [--cores 25]
        [--bf-interval 1] [--placement slurm-tasks|one-node] [--name slurm_replay]
    python -m benchmarks.cluster.slurm_replay --plan-only     # the slice and its compression, no Slurm

Writes benchmarks/results/NAME.json and NAME.png, and NAME_raw.json: what Slurm wrote (its
log, the job ids), which ``--from-raw`` analyses again without a replay. The cluster (ports 46817.., nodes rp1..,
folder /tmp/replay-cluster/cluster) is brought down at the end, also on an error or Ctrl-C.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence


from benchmarks.common import PWA, RESULTS, machine, save

from malleable_sim import Placement
from malleable_sim.metrics import percentile
from malleable_sim.swf import read_swf
from malleable_sim.replay import (BATCH_SCHED_DELAY_S, BF_MAX_JOB_TEST,
                                  LAUNCH_MARGIN_S, ReplayJob, auto_factor, compress,
                                  fit_cadence, real_times, rounding_report, run_sim,
                                  schedule_metrics, scheduler_parameters, sim_jobs, sim_times,
                                  slice_jobs, start_errors, summary_of)

BASE = Path("/tmp/replay-cluster")
ROOT = BASE / "cluster"
PORT_BASE = 19817
PHASES = 10                 # phases of the backfill cadence tried when it is not known


def replay(jobs: Sequence[ReplayJob], *, nodes: int, cores: int, bf_interval_s: int,
           log=print) -> dict:
    """Bring up the cluster, submit every job at its time, wait until all ended, read what
    slurmctld wrote, bring the cluster down. Returns the raw observations."""
    from slurm_plugin.cluster.local import LocalCluster, default_spec
    if (ROOT / "cluster.json").exists():
        if LocalCluster.load(ROOT).is_running():
            raise SystemExit(f"a cluster already runs in {ROOT}: bring it down first")
        shutil.rmtree(ROOT)     # no state of an earlier run: job ids start at 1, logs empty
    for d in (BASE, ROOT):
        d.mkdir(exist_ok=True)
        d.chmod(0o755)          # munged wants every folder above its socket traversable
    spec = default_spec(ROOT, nodes=nodes, cpus_per_node=cores, node_prefix="rp",
                        port_base=PORT_BASE, name="replaycl",
                        scheduler_parameters=scheduler_parameters(bf_interval_s))
    cluster = LocalCluster(spec)
    env = {**os.environ, **cluster.env()}
    submitted: dict[int, dict] = {}
    t_up = time.time()
    cluster.up(timeout_s=120, log=log)
    log(f"cluster up in {time.time() - t_up:.1f} s: {nodes} x {cores} CPUs, "
        f"SchedulerParameters={spec.scheduler_parameters}")
    problems: list[str] = []
    try:
        time.sleep(2.0)
        t0 = time.time()
        for j in jobs:
            delay = t0 + j.submit_s - time.time()
            if delay > 0:
                time.sleep(delay)
            before = time.time()
            out = subprocess.run(
                ["sbatch", "--parsable", "-n", str(j.procs), "-t", str(j.limit_min),
                 "-J", f"rp{j.index}", "-o", "/dev/null", "-e", "/dev/null",
                 "-D", str(ROOT / "tmp"), "--wrap", f"sleep {j.sleep_s:.3f}"],
                capture_output=True, text=True, env=env, timeout=30)
            after = time.time()
            if out.returncode != 0:
                raise RuntimeError(f"sbatch for job {j.index} failed: {out.stderr.strip()}")
            job_id = int(out.stdout.strip().split(";")[0])
            submitted[j.index] = {"job_id": job_id, "sbatch_start": before - t0,
                                  "sbatch_end": after - t0}
            if j.index % 20 == 0:
                log(f"  t={after - t0:6.1f} s submitted {j.index}/{len(jobs)} "
                    f"(lag {before - t0 - j.submit_s:+.3f} s)")
        log("all submitted; waiting for the queue to drain")
        deadline = time.time() + 3600
        while time.time() < deadline:
            q = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True,
                               env=env, timeout=30)
            left = [ln for ln in q.stdout.splitlines() if ln.strip()]
            if q.returncode == 0 and not left:
                break
            time.sleep(2.0)
        log(f"queue empty at t={time.time() - t0:.1f} s")
        time.sleep(1.0)
        ctld_text = (ROOT / "log" / "slurmctld.log").read_text(errors="replace")
        jobcomp_text = (ROOT / "log" / "jobcomp.log").read_text(errors="replace") \
            if (ROOT / "log" / "jobcomp.log").exists() else ""
    finally:
        problems = cluster.down()
        log(f"cluster down{': ' + '; '.join(problems) if problems else ''}")
    return {"t0": t0, "submitted": submitted, "ctld_log": ctld_text,
            "jobcomp_log": jobcomp_text, "down_problems": problems}


def plot(rows: list[dict], errors: dict, path: Path, placement: str = "slurm-tasks") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    real = [r["real"]["start_s"] for r in rows]
    sim = [r["sim"]["start_s"] for r in rows]
    sim2 = [r["sim_measured_inputs"]["start_s"] for r in rows]
    sim3 = [r["sim_measured_inputs"]["start_with_cadence_s"] for r in rows]
    bf = [r["how"] == "backfill" for r in rows]
    ax = axes[0]
    top = max(real + sim) * 1.03
    ax.plot([0, top], [0, top], color="grey", lw=0.8)
    ax.scatter([x for x, b in zip(real, bf) if not b], [y for y, b in zip(sim, bf) if not b],
               s=12, label="started by Slurm's main scheduler")
    ax.scatter([x for x, b in zip(real, bf) if b], [y for y, b in zip(sim, bf) if b],
               s=12, marker="^", label="started by Slurm's backfill")
    ax.set_xlabel("real Slurm start (s of the replay)")
    ax.set_ylabel("simulated start (s)")
    ax.set_title(f"start times: simulator ({placement}) vs slurmctld")
    ax.legend(fontsize=8)
    ax = axes[1]
    other = [p for p in rows[0]["relative_error_by_placement"] if p != placement]
    for p in other:
        d = sorted(r["relative_error_by_placement"][p] for r in rows)
        ax.plot(d, [(k + 1) / len(d) for k in range(len(d))], ls=":",
                label=f"simulator ({p}), replay's inputs")
    for series, label in ((sim, f"simulator ({placement}), replay's inputs"),
                          (sim2, "simulator, measured submits and run times"),
                          (sim3, "the same, backfill passes on Slurm's measured cadence")):
        d = sorted(abs(s - r) / max(rr["real"]["wait_s"], errors["floor_s"])
                   for s, r, rr in zip(series, real, rows))
        ax.plot(d, [(k + 1) / len(d) for k in range(len(d))], label=label)
    ax.axvline(0.10, color="grey", ls="--", lw=0.8)
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_xlim(left=0)
    ax.set_xlabel(f"|sim - real| start / max(real wait, {errors['floor_s']:g} s)")
    ax.set_ylabel("share of jobs")
    ax.set_title("per-job start error (CDF)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def plan_jobs(trace: str, start: int, count: int, *, nodes: int, cores: int,
              factor: float | None, target_s: float = 600.0
              ) -> tuple[list[ReplayJob], dict, float]:
    """The slice's jobs compressed by ``factor`` (None: the factor that makes the simulated
    replay last about ``target_s``), what was dropped from it, and the factor."""
    log = read_swf((PWA / f"{trace}.swf.gz").read_bytes())
    trace_jobs, drops = slice_jobs(log, start, count, nodes=nodes, cores=cores)
    if factor is None:
        factor = auto_factor(trace_jobs, nodes=nodes, cores=cores, target_s=target_s)
    return compress(trace_jobs, factor), drops, factor


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="KTH-SP2-1996-2.1-cln")
    ap.add_argument("--start", type=int, default=19400, help="first line of the slice (0-based)")
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--factor", default="auto")
    ap.add_argument("--target-s", type=float, default=600.0)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--cores", type=int, default=25)
    ap.add_argument("--bf-interval", type=int, default=1)
    ap.add_argument("--floor", type=float, default=None, help="default: bf_interval")
    ap.add_argument("--name", default="slurm_replay")
    ap.add_argument("--placement", choices=[p.value for p in Placement],
                    default=Placement.SLURM_TASKS.value,
                    help="the simulator's placement of a job that fits a node (the other one is "
                         "reported beside it, under by_placement)")
    ap.add_argument("--plan-only", action="store_true")
    ap.add_argument("--from-raw", action="store_true",
                    help="no replay: analyse the observations of the last one (NAME_raw.json)")
    args = ap.parse_args(argv)
    floor_s = args.floor if args.floor is not None else float(args.bf_interval)

    jobs, drops, factor = plan_jobs(args.trace, args.start, args.jobs, nodes=args.nodes,
                                    cores=args.cores, target_s=args.target_s,
                                    factor=None if args.factor == "auto" else float(args.factor))
    rounding = rounding_report(jobs, factor)
    placement = Placement(args.placement)
    sim = run_sim(sim_jobs(jobs), nodes=args.nodes, cores=args.cores,
                  bf_interval_s=args.bf_interval, placement=placement)
    print(f"{args.trace} lines {args.start}..{args.start + args.jobs}: {len(jobs)} jobs, "
          f"factor {factor:g}; widest {max(j.procs for j in jobs)} procs on "
          f"{args.nodes} x {args.cores}; simulated makespan {sim.makespan_s:.0f} s, "
          f"mean wait {sim.mean_wait_s:.1f} s; rounding {rounding}")
    if args.plan_only:
        return 0

    raw_path = RESULTS / f"{args.name}_raw.json"
    if args.from_raw:
        raw = json.loads(raw_path.read_text())
        raw["submitted"] = {int(k): v for k, v in raw["submitted"].items()}
    else:
        raw = replay(jobs, nodes=args.nodes, cores=args.cores, bf_interval_s=args.bf_interval)
        RESULTS.mkdir(exist_ok=True)
        raw_path.write_text(json.dumps(raw))   # what Slurm wrote: --from-raw reads it again
    real, info = real_times(jobs, raw)
    missing = [j.index for j in jobs if j.index not in real]
    # The diagnostic simulation: each job's measured submit (slurmctld's) and run (end - start).
    measured_jobs = sim_jobs(jobs, submit={i: t.submit_s for i, t in real.items()},
                             runtime={i: t.end_s - t.start_s for i, t in real.items()})
    measured = run_sim(measured_jobs, nodes=args.nodes, cores=args.cores,
                       bf_interval_s=args.bf_interval, placement=placement)
    simt, simm = sim_times(sim), sim_times(measured)
    errors = start_errors(simt, real, floor_s=floor_s)
    errors_measured = start_errors(simm, real, floor_s=floor_s)
    # Both placements side by side (the chosen one repeats the figures above).
    by_placement = {}
    for p in Placement:
        pt = sim_times(run_sim(sim_jobs(jobs), nodes=args.nodes, cores=args.cores,
                               bf_interval_s=args.bf_interval, placement=p))
        pm = sim_times(run_sim(measured_jobs, nodes=args.nodes, cores=args.cores,
                               bf_interval_s=args.bf_interval, placement=p))
        sched = schedule_metrics({i: pt[i] for i in real})
        err, err_m = start_errors(pt, real, floor_s=floor_s), start_errors(pm, real,
                                                                           floor_s=floor_s)
        by_placement[p.value] = {
            "sim": sched,
            "sim_over_real": {m: sched[m] / v for m in ("mean_wait_s", "mean_response_s",
                                                        "makespan_s")
                              if (v := schedule_metrics(real)[m])},
            "jobs_on_several_nodes_within_a_node": sum(
                1 for r in (run_sim(sim_jobs(jobs), nodes=args.nodes, cores=args.cores,
                                    bf_interval_s=args.bf_interval, placement=p).per_job)
                if r.cores <= args.cores and r.nodes > 1),
            "errors": summary_of(err),
            "errors_measured_inputs": summary_of(err_m),
            "per_job_relative": err["per_job_relative"]}
    # Measured inputs and Slurm's measured cadence: the backfill passes where its log shows
    # them (the phase of slurmctld's clock, which no trace can know, and its period).
    cadence = fit_cadence([t.start_s for i, t in real.items() if info[i]["how"] == "backfill"],
                          float(args.bf_interval))
    simc = sim_times(run_sim(measured_jobs, nodes=args.nodes, cores=args.cores,
                             bf_interval_s=args.bf_interval, placement=placement,
                             cadence=cadence))
    errors_cycle = start_errors(simc, real, floor_s=floor_s)
    # The trace's own inputs with that cadence, and with each of PHASES phases of it: what the
    # stand-in gets when it knows slurmctld's clock, and what it gets when it does not.
    simk = sim_times(run_sim(sim_jobs(jobs), nodes=args.nodes, cores=args.cores,
                             bf_interval_s=args.bf_interval, placement=placement,
                             cadence=cadence))
    errors_cadence = start_errors(simk, real, floor_s=floor_s)
    phase_sweep = {}
    for k in range(PHASES):
        phased = dataclasses.replace(cadence, phase_s=k * cadence.period_s / PHASES)
        e = start_errors(sim_times(run_sim(sim_jobs(jobs), nodes=args.nodes, cores=args.cores,
                                           bf_interval_s=args.bf_interval,
                                           placement=placement, cadence=phased)),
                         real, floor_s=floor_s)["relative"]
        phase_sweep[f"{phased.phase_s:.3f}"] = {"median": e["median"], "p90": e["p90"]}
    sweep_median = statistics.median(v["median"] for v in phase_sweep.values())
    by_index = {j.index: j for j in jobs}
    rows = []
    for i in sorted(real):
        j = by_index[i]
        rows.append({
            **dataclasses.asdict(j), **info[i],
            "submit_lag_s": real[i].submit_s - j.submit_s,
            "overhead_s": (real[i].end_s - real[i].start_s) - j.sleep_s,
            "real": {"submit_s": real[i].submit_s, "start_s": real[i].start_s,
                     "end_s": real[i].end_s, "wait_s": real[i].wait_s},
            "sim": {"start_s": simt[i].start_s, "end_s": simt[i].end_s,
                    "wait_s": simt[i].wait_s},
            "sim_measured_inputs": {"start_s": simm[i].start_s, "end_s": simm[i].end_s,
                                    "start_with_cadence_s": simc[i].start_s},
            "relative_error": errors["per_job_relative"][str(i)],
            "relative_error_by_placement": {p: v["per_job_relative"][str(i)]
                                            for p, v in by_placement.items()},
            "relative_error_measured_inputs": errors_measured["per_job_relative"][str(i)]})
    lags = [r["submit_lag_s"] for r in rows]
    overheads = [r["overhead_s"] for r in rows]
    summary = {"real": schedule_metrics(real),
               "sim": schedule_metrics({i: simt[i] for i in real}),
               "sim_measured_inputs": schedule_metrics({i: simm[i] for i in real})}
    for k in ("sim", "sim_measured_inputs"):
        summary[f"{k}_over_real"] = {m: summary[k][m] / summary["real"][m]
                                     for m in ("mean_wait_s", "mean_response_s", "makespan_s")
                                     if summary["real"][m]}
    data = {
        "what": "issue 26 part 7: the simulator's static regime against real Slurm on a "
                "time-compressed slice of a real trace, replayed as sleep jobs",
        "trace": args.trace, "slice_first_line": args.start, "slice_lines": args.jobs,
        "trace_jobs": [jobs[0].trace_job, jobs[-1].trace_job], **drops,
        "factor": factor, "cluster": {"nodes": args.nodes, "cpus_per_node": args.cores,
                                      "real_cpus": None},
        "scheduler_parameters": scheduler_parameters(args.bf_interval),
        "simulator": {"policy": "static", "placement": placement.value,
                      "backfill": "conservative",
                      "backfill_depth": BF_MAX_JOB_TEST,
                      "backfill_interval_s": args.bf_interval, "queue_order": "fcfs",
                      "batch_sched_delay_s": BATCH_SCHED_DELAY_S},
        "launch_margin_s": LAUNCH_MARGIN_S, "rounding": rounding,
        "jobs_replayed": len(jobs), "jobs_measured": len(real), "jobs_missing": missing,
        "started_by": {h: sum(r["how"] == h for r in rows) for h in ("main", "backfill")},
        "submit_lag_s": {"median": statistics.median(lags), "p90": percentile(lags, 90),
                         "max": max(lags)},
        "run_overhead_s": {"median": statistics.median(overheads),
                           "p90": percentile(overheads, 90), "max": max(overheads)},
        "jobcomp_vs_ctld_start_max_s": max(
            (abs(r["jobcomp_start_s"] - r["real"]["start_s"]) for r in rows
             if r["jobcomp_start_s"] is not None), default=None),
        "summary": summary,
        "errors": summary_of(errors),
        "by_placement": by_placement,
        "errors_measured_inputs": summary_of(errors_measured),
        "cadence": dataclasses.asdict(cadence),
        "errors_measured_inputs_and_cadence": summary_of(errors_cycle),
        "sim_start_at_submit": {
            "jobs": sum(simt[i].wait_s < 1e-9 for i in real),
            "their_real_wait_s": {
                "median": statistics.median([real[i].wait_s for i in real
                                             if simt[i].wait_s < 1e-9] or [math.nan]),
                "max": max([real[i].wait_s for i in real if simt[i].wait_s < 1e-9] or
                           [math.nan])}},
        "errors_with_cadence": summary_of(errors_cadence),
        "phase_sweep": {"phases": phase_sweep, "median_of_medians": sweep_median},
        "goal": "median relative start error <= 0.10",
        "goal_met_knowing_cadence": errors_cadence["relative"]["median"] <= 0.10,
        "goal_met": sweep_median <= 0.10,
        "cluster_down_problems": raw["down_problems"],
        "machine": machine(), "per_job": rows,
    }
    from slurm_plugin.cluster.local import host_topology
    data["cluster"]["real_cpus"] = host_topology().cpus
    save(args.name, data)
    for v in by_placement.values():
        del v["per_job_relative"]
    plot(rows, errors, RESULTS / f"{args.name}.png", placement=placement.value)
    print(f"real: {summary['real']}\nsim:  {summary['sim']}\n"
          f"sim (measured inputs): {summary['sim_measured_inputs']}")
    for p, v in by_placement.items():
        print(f"{p}: relative start error median {v['errors']['relative']['median']:.3f}, "
              f"p90 {v['errors']['relative']['p90']:.3f}; sim/real {v['sim_over_real']}")
    print(f"relative start error: median {errors['relative']['median']:.3f}, p90 "
          f"{errors['relative']['p90']:.3f}; with measured inputs: median "
          f"{errors_measured['relative']['median']:.3f}, p90 "
          f"{errors_measured['relative']['p90']:.3f}; and Slurm's measured backfill "
          f"cadence (period {cadence.period_s:.4f} s): median "
          f"{errors_cycle['relative']['median']:.3f}, p90 {errors_cycle['relative']['p90']:.3f}")
    print(f"the trace's inputs with Slurm's cadence: median "
          f"{errors_cadence['relative']['median']:.3f}, p90 "
          f"{errors_cadence['relative']['p90']:.3f}; over {PHASES} phases of it: median of "
          f"medians {sweep_median:.3f} ({min(v['median'] for v in phase_sweep.values()):.3f}"
          f"..{max(v['median'] for v in phase_sweep.values()):.3f}); goal met knowing the "
          f"cadence: {data['goal_met_knowing_cadence']}, not knowing it: {data['goal_met']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
