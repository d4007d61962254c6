"""Does malleability finish more work sooner? A reference workload of TensorFlow jobs arriving
over time on the real local cluster, run once per regime:

    static        Slurm alone: plain TensorFlow jobs with as many threads as cores allocated, on
                  their allocation (the agent runs with the static policy)
    cgroup-only   the same plain jobs; the agent lends idle cores to their cgroups (lend-idle),
                  their threads stay as many as Slurm allocated (what `docker update` or a
                  cpuset-only agent gives)
    lend-idle     idle cores shared among malleable jobs; malleable_tf follows
    throughput    idle cores where the jobs' measured steps/s say they add the most

One node with this machine's 2 cores (the local cluster's node is the host; no other node shares
them). Every job asks Slurm for 1 core; malleable jobs say min=1,max=2. Each job runs a fixed
number of steps (benchmarks/framework/workloads.py: the Keras CNN, compute-bound, or the tf.data pipeline,
input-bound) and reports its start, end and CPU seconds. Measured per regime: makespan, mean
completion (submit to end), core utilisation (the jobs' CPU seconds / (2 cores x makespan)),
resizes and their latency (the agent's event log); every 0.5 s each job's cpuset and threads.

    python -m benchmarks.cluster.coscheduling.run [--regimes static,cgroup-only,lend-idle,throughput] [--name NAME]
    python -m benchmarks.cluster.coscheduling.run --seeds 1-10 [--regimes static,lend-idle,throughput]
        [--name coscheduling_random] [--pool-only]

Writes benchmarks/results/coscheduling.json and coscheduling.png (``--name`` for a repetition).
With ``--seeds``, each seed is one repetition with randomised arrivals (the same five jobs in a
random order, arriving as a Poisson process with the reference's mean gap; every regime of a
repetition sees the same arrivals), written as NAME_seedK.json; a seed already written is not
run again. Then NAME.json pools them: per regime, the paired geometric mean over the
repetitions of its makespan and mean completion over static's, with a bootstrap 95% interval,
and NAME.png shows each repetition's ratios.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path


from benchmarks.common import REPO, RESULTS, geomean_interval, machine, median, percentile, save

from slurm_plugin.cluster import LocalCluster, default_spec
from slurm_plugin.node.cgroup_actuator import read_cpus
from malleable_policy.model import Policy
from slurm_plugin.node.ranks import read_job_statuses
from slurm_plugin.slurm import JobState


NODE = "cs1"


@dataclass(frozen=True)
class RefJob:
    name: str
    submit_s: float          # after the run's start
    workload: str
    steps: int
    malleable: bool


# About 30 s each on one core here, arriving so that the node is often half idle (one job
# running): the cores Slurm leaves idle are what malleability can use.
JOBS = (RefJob("A", 0, "keras_cnn", 6000, True),
        RefJob("B", 20, "tf_data", 8000, True),
        RefJob("C", 40, "keras_cnn", 6000, False),
        RefJob("D", 70, "keras_cnn", 6000, True),
        RefJob("E", 90, "tf_data", 8000, True))

MEAN_GAP_S = 22.5          # the reference's mean gap between arrivals (90 s over 4 gaps)


def random_arrivals(seed: int) -> tuple[RefJob, ...]:
    """The reference's five jobs in a random order, the first at 0 and the others after
    exponential gaps of the reference's mean: sometimes a job runs alone on the node, sometimes
    several queue, which is what decides how much idle cores are worth."""
    rng = random.Random(f"coscheduling-arrivals-{seed}")
    t, out = 0.0, []
    for i, job in enumerate(rng.sample(JOBS, len(JOBS))):
        t += rng.expovariate(1 / MEAN_GAP_S) if i else 0.0
        out.append(dataclasses.replace(job, submit_s=round(t, 1)))
    return tuple(out)


# Slurm alone runs plain TensorFlow jobs with as many threads as cores allocated; cgroup-only
# runs the same jobs with the agent lending idle cores to their cgroups.
REGIMES = {"static": (Policy.STATIC, "plain"), "cgroup-only": (Policy.LEND_IDLE, "plain"),
           "lend-idle": (Policy.LEND_IDLE, "malleable"),
           "throughput": (Policy.THROUGHPUT, "malleable")}


def job_cpus(cluster: LocalCluster, job_id: int) -> frozenset[int] | None:
    """The job's cpuset (the jobs are root's: uid 0), as the agent reads it."""
    return read_cpus(cluster.cgroup_layout(NODE).job_dir(0, job_id))


def submit(env: dict, root: Path, job: RefJob, mode: str,
           plain_mode: str = "plain") -> tuple[int, float]:
    mode = mode if job.malleable else plain_mode
    args = ["sbatch", "--parsable", "-N1", "-n1", "-c1", f"-w{NODE}", f"-J{job.name}",
            f"-o{root}/{job.name}.out"]
    if job.malleable:
        args.append("--comment=malleable:min=1,max=2")
    cmd = (f"cd {REPO} && exec {sys.executable} -m benchmarks.cluster.coscheduling.job "
           f"{job.workload} {job.steps} {mode}")
    t = time.time()
    out = subprocess.run([*args, "--wrap", cmd], env=env, check=True, capture_output=True,
                         text=True)
    return int(out.stdout.split(";")[0]), t


def run_regime(name: str, root: Path, port: int, workload: tuple[RefJob, ...] = JOBS,
               plain_mode: str = "plain") -> dict:
    """``plain_mode``: how plain jobs run (job.py's ``plain`` or ``plain-noautotune``)."""
    policy, mode = REGIMES[name]
    mode = plain_mode if mode == "plain" else mode
    root.mkdir(mode=0o755)
    cluster = LocalCluster(default_spec(root, nodes=1, port_base=port, node_prefix="cs",
                                        name="malleablecs"))
    cluster.up(agents=policy)
    env = {**os.environ, **cluster.env()}
    client = cluster.client()
    ids: dict[str, int] = {}
    submitted: dict[str, float] = {}
    samples: list[dict] = []
    telemetry: dict[str, dict] = {}
    t0 = time.time()
    try:
        pending = sorted(workload, key=lambda j: j.submit_s)
        while True:
            now = time.time() - t0
            while pending and now >= pending[0].submit_s:
                job = pending.pop(0)
                ids[job.name], submitted[job.name] = submit(env, root, job, mode, plain_mode)
            for jname, jid in ids.items():
                cpus = job_cpus(cluster, jid)
                st = read_job_statuses(cluster.run_layout, jid)
                if st:
                    telemetry[jname] = {str(k): v for s in st for k, v in s.steps_per_s.items()}
                if cpus is not None:
                    samples.append({"t": round(now, 2), "job": jname, "cores": len(cpus),
                                    "threads": [s.intra_active for s in st]})
            states = {k: client.job(v).state for k, v in ids.items()}
            if not pending and all(not s.holds_cores and s is not JobState.PENDING
                                   for s in states.values()):
                break
            if now > 600:
                raise TimeoutError(f"{name}: jobs still running after 600 s: {states}")
            time.sleep(0.5)
        events = []
        log = root / "agent" / f"events-{NODE}.jsonl"
        if log.exists():
            events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    finally:
        problems = cluster.down()
        if problems:
            print(f"{name}: cluster down left {problems}", file=sys.stderr)
    jobs = {}
    for job in workload:
        text = (root / f"{job.name}.out").read_text()
        line = next((x for x in text.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"{name}: job {job.name} printed no result:\n{text[-2000:]}")
        r = json.loads(line[7:])
        jobs[job.name] = {**asdict(job), "submitted": submitted[job.name] - t0,
                          "start": r["start"] - t0, "ready": r["ready"] - t0,
                          "end": r["end"] - t0, "cpu_s": r["cpu_s"],
                          "steps_per_s_by_threads": telemetry.get(job.name, {})}
    first = min(j["submitted"] for j in jobs.values())
    makespan = max(j["end"] for j in jobs.values()) - first
    resizes = [e for e in events if e.get("status") == "applied"
               and e.get("event") in ("grow", "shrink", "move")]
    lat = [e["latency_ms"] for e in resizes if e.get("latency_ms") is not None]
    return {"regime": name, "policy": policy.value, "job_mode": mode, "jobs": jobs,
            "makespan_s": makespan,
            "mean_completion_s": sum(j["end"] - j["submitted"] for j in jobs.values()) / len(jobs),
            "utilisation": sum(j["cpu_s"] for j in jobs.values()) / (2 * makespan),
            "resizes": len(resizes), "resize_latency_ms": {"p50": median(lat),
                                                           "p95": percentile(lat, 95)},
            "samples": samples}


def plot(data: dict, name: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = data["runs"]
    names = [j.name for j in JOBS]
    fig, axes = plt.subplots(len(runs) + 1, 1, figsize=(9, 2.2 * (len(runs) + 1)))
    colors = dict(zip(names, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, run in zip(axes, runs):
        ts = sorted({s["t"] for s in run["samples"]})
        by = {(s["t"], s["job"]): s["cores"] for s in run["samples"]}
        ax.stackplot(ts, [[by.get((t, n), 0) for t in ts] for n in names], labels=names,
                     colors=[colors[n] for n in names], step="post")
        ax.set_ylim(0, 2.2)
        ax.set_ylabel("cores")
        ax.set_title(f"{run['regime']}: makespan {run['makespan_s']:.0f} s, mean completion "
                     f"{run['mean_completion_s']:.0f} s", fontsize=9)
    axes[0].legend(fontsize=7, ncol=len(names), loc="upper right")
    ax = axes[-1]
    xs = range(len(runs))
    ax.bar([x - 0.2 for x in xs], [r["makespan_s"] for r in runs], 0.4, label="makespan")
    ax.bar([x + 0.2 for x in xs], [r["mean_completion_s"] for r in runs], 0.4,
           label="mean completion")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["regime"] for r in runs])
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = RESULTS / f"{name}.png"
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument("--port-base", type=int, default=8817)
    ap.add_argument("--name", default="coscheduling",
                    help="results as benchmarks/results/NAME.json and .png (a repetition: "
                         "another name)")
    ap.add_argument("--seeds", default=None,
                    help="repetitions with randomised arrivals, one per seed: 1-10 or 1,4,7")
    ap.add_argument("--pool-only", action="store_true",
                    help="with --seeds: pool the repetitions already written, run nothing")
    ap.add_argument("--plain-autotune", choices=("on", "off"), default="on",
                    help="off: plain jobs' tf.data pipelines run without tf.data's autotuner, "
                         "as malleable_tf.data's do (malleability alone, without TensorFlow's "
                         "teardown race in the plain jobs only)")
    args = ap.parse_args()
    regimes = args.regimes.split(",")
    plain_mode = "plain" if args.plain_autotune == "on" else "plain-noautotune"
    if args.seeds is None:
        data = one_repetition(regimes, JOBS, args.port_base, plain_mode)
        save(args.name, data)
        print("wrote", plot(data, args.name))
        return
    seeds = parse_seeds(args.seeds)
    for seed in seeds:
        if args.pool_only or (RESULTS / f"{args.name}_seed{seed}.json").exists():
            continue
        print(f"seed {seed}", flush=True)
        data = one_repetition(regimes, random_arrivals(seed), args.port_base, plain_mode)
        save(f"{args.name}_seed{seed}", {**data, "seed": seed})
    pooled = pool([json.loads((RESULTS / f"{args.name}_seed{s}.json").read_text())
                   for s in seeds if (RESULTS / f"{args.name}_seed{s}.json").exists()])
    print(json.dumps(pooled["vs_static"], indent=1))
    save(args.name, pooled)
    print("wrote", plot_pooled(pooled, args.name))


def parse_seeds(text: str) -> list[int]:
    """``1-10`` or ``1,4,7``."""
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(x) for x in text.split(",")]


def one_repetition(regimes: list[str], workload: tuple[RefJob, ...], port_base: int,
                   plain_mode: str = "plain") -> dict:
    """Every regime, one after the other, on the same arrivals."""
    base = Path(tempfile.mkdtemp(prefix="malleable-cosched-", dir="/tmp"))
    base.chmod(0o755)
    runs = []
    try:
        for i, name in enumerate(regimes):
            print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
            runs.append(run_regime(name, base / name, port_base + 100 * i, workload, plain_mode))
            r = runs[-1]
            print(f"  makespan {r['makespan_s']:.1f} s, mean completion "
                  f"{r['mean_completion_s']:.1f} s, utilisation {r['utilisation']:.2f}, "
                  f"resizes {r['resizes']}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    static = next((r for r in runs if r["regime"] == "static"), None)
    data = {"benchmark": "co-scheduling, real runs", "machine": machine(), "node_cores": 2,
            "plain_mode": plain_mode, "jobs": [asdict(j) for j in workload], "runs": runs}
    if static:
        data["vs_static"] = {r["regime"]: {
            "makespan": round(r["makespan_s"] / static["makespan_s"], 3),
            "mean_completion": round(r["mean_completion_s"] / static["mean_completion_s"], 3)}
            for r in runs}
        print(json.dumps(data["vs_static"], indent=1))
    return data


POOLED_METRICS = ("makespan_s", "mean_completion_s")
# A job whose cgroup outlives its last line by more than this holds cores it no longer uses (a
# plain job's goes within 3.2 s here: Slurm's epilog and the 0.5 s sampling).
HELD_AFTER_END_S = 5.0


def held_after_end(run: dict) -> dict[str, float]:
    """Per job: seconds from its last line to the last sample that saw its cgroup."""
    last: dict[str, float] = {}
    for s in run["samples"]:
        last[s["job"]] = max(last.get(s["job"], s["t"]), s["t"])
    return {name: round(last[name] - job["end"], 2) for name, job in run["jobs"].items()
            if name in last}


def pool(repetitions: list[dict]) -> dict:
    """Per regime and metric, the paired geometric mean over the repetitions of the regime's
    value over static's in the same repetition, with its bootstrap 95% interval."""
    ratios: dict[str, dict[str, list[float]]] = {}
    for rep in repetitions:
        by = {r["regime"]: r for r in rep["runs"]}
        for name, run in by.items():
            for m in POOLED_METRICS:
                ratios.setdefault(name, {}).setdefault(m, []).append(
                    run[m] / by["static"][m])
    return {"benchmark": "co-scheduling, real runs, randomised arrivals", "machine": machine(),
            "node_cores": 2, "repetitions": len(repetitions),
            "seeds": [rep.get("seed") for rep in repetitions],
            "vs_static": {name: {m: {**geomean_interval(v), "per_repetition": [round(x, 4)
                                                                              for x in v]}
                                 for m, v in ms.items()}
                          for name, ms in ratios.items() if name != "static"},
            "utilisation": {name: [round(r["utilisation"], 3) for rep in repetitions
                                   for r in rep["runs"] if r["regime"] == name]
                            for name in ratios},
            "held_after_end": {name: held_after_end_summary(
                [(r, rep["jobs"], rep.get("plain_mode", "plain")) for rep in repetitions
                 for r in rep["runs"] if r["regime"] == name]) for name in ratios}}


def held_after_end_summary(runs: list[tuple[dict, list[dict], str]]) -> dict:
    """Per workload and job mode: how many job runs held their cgroup more than
    HELD_AFTER_END_S after their last line, and the longest. ``runs``: (a regime's run, the
    repetition's jobs, how its plain jobs ran: ``plain`` or ``plain-noautotune``)."""
    out: dict[str, dict] = {}
    for run, jobs, plain_mode in runs:
        malleable = {j["name"]: j["malleable"] for j in jobs}
        for name, held in held_after_end(run).items():
            mode = run["job_mode"] if malleable[name] else plain_mode
            key = f"{run['jobs'][name]['workload']} {mode}"
            row = out.setdefault(key, {"runs": 0, "held": 0, "longest_s": 0.0})
            row["runs"] += 1
            row["held"] += held > HELD_AFTER_END_S
            row["longest_s"] = max(row["longest_s"], held)
    return out


def plot_pooled(pooled: dict, name: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    regimes = list(pooled["vs_static"])
    fig, axes = plt.subplots(1, len(POOLED_METRICS), figsize=(9, 3.4), sharey=True)
    for ax, m in zip(axes, POOLED_METRICS):
        for x, regime in enumerate(regimes):
            cell = pooled["vs_static"][regime][m]
            ax.scatter([x] * len(cell["per_repetition"]), cell["per_repetition"], s=12,
                       alpha=0.5, color="grey")
            if cell["geomean"] is not None:
                ax.errorbar([x + 0.15], [cell["geomean"]],
                            yerr=[[cell["geomean"] - cell["lo"]], [cell["hi"] - cell["geomean"]]],
                            fmt="o", color="C0", capsize=4)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks(range(len(regimes)))
        ax.set_xticklabels(regimes)
        ax.set_title(f"{m} / static ({pooled['repetitions']} repetitions)", fontsize=9)
    axes[0].set_ylabel("ratio (geomean, 95% interval)")
    fig.tight_layout()
    path = RESULTS / f"{name}.png"
    fig.savefig(path, dpi=110)
    return path

if __name__ == "__main__":
    main()
