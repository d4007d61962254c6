"""The main demo: malleable Horovod jobs sharing a local 3-node Slurm cluster.

1. A local Slurm cluster (3 nodes, real cgroups) with the co-scheduler agent on every node.
2. Job A (2 nodes, one rank each, from the multi-node template) starts on one core per node and
   borrows the idle cores; job B and later job C (co-scheduling template) arrive on A's nodes, and
   A gives the cores back before they start. An owner's `scontrol update ... cpus=1` shrinks A
   later, and `cpus=2` grows it again. Every rank's TensorFlow threads follow, live.
3. A status table refreshes while it runs; at the end, a summary per job and a PNG timeline of
   cores per job per node. The cluster goes down at the end, also on Ctrl-C.

Run it with `make demo` (which installs everything first).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import examples.train_digits as train_digits
from sbatch_templates import render
from slurm_plugin.cluster import LocalCluster, default_spec
from malleable_policy.model import Policy
from slurm_plugin.node.ranks import read_job_statuses
from slurm_plugin.commands.status import collect_status, format_table
from slurm_plugin.feed import FeedStore
from slurm_plugin.slurm import JobState

TRAIN = Path(train_digits.__file__).resolve()


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def submit(cluster: LocalCluster, template: str, values: dict[str, str]) -> int:
    values = {"python": sys.executable,
              "launcher": str(Path(sys.executable).with_name("malleable-srun")), **values}
    script = cluster.paths.root / f"{values['job_name']}.sbatch"
    script.write_text(render(template, values))
    return cluster.client().submit(script, [f"--chdir={cluster.paths.root}"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="/tmp/malleable-demo")
    ap.add_argument("--port-base", type=int, default=18817)
    ap.add_argument("--out", default="demo-results", help="folder for the summary and the PNG")
    args = ap.parse_args()
    root = Path(args.dir)
    if root.exists():
        leftover = LocalCluster.load(root) if (root / "cluster.json").exists() else None
        if leftover is not None and leftover.is_running():
            leftover.down()
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    out_dir = Path(args.out).absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(default_spec(root, nodes=3, port_base=args.port_base))
    t0 = time.monotonic()
    say(f"bringing up a 3-node Slurm cluster with a co-scheduler agent per node in {root}")
    cluster.up(log=say, agents=Policy.LEND_IDLE)
    env = {**os.environ, **cluster.env()}
    timeline: list[dict] = []
    rates: dict[str, dict] = {}
    store = FeedStore(cluster.paths.root / "feed")
    jobs: dict[str, int] = {}
    try:
        client = cluster.client()
        train = str(TRAIN)
        jobs["A"] = submit(cluster, "multi-node", {
            "job_name": "A-multinode", "nodes": "2", "tasks_per_node": "1", "program": train,
            "args": "--epochs 100000 --max-seconds 110", "output": "A-%j.out", "time": "10"})
        say(f"job A ({jobs['A']}): 2 nodes x 1 rank, malleable:min=1,max=node")
        events = [(35, "B"), (55, "C"), (80, "shrink"), (105, "grow")]
        nodes_of_a: list[str] = []
        live = sys.stdout.isatty()
        start = time.monotonic()
        while True:
            now = time.monotonic() - start
            while events and now >= events[0][0]:
                _, what = events.pop(0)
                if not nodes_of_a:
                    nodes_of_a = list(client.job(jobs["A"]).nodes)
                if what in ("B", "C"):
                    node = nodes_of_a[0] if what == "B" else nodes_of_a[-1]
                    jobs[what] = submit(cluster, "coschedule", {
                        "job_name": f"{what}-cosched", "nodelist": node, "program": train,
                        "args": "--epochs 100000 --max-seconds 20", "output": f"{what}-%j.out",
                        "time": "5"})
                    say(f"job {what} ({jobs[what]}) arrives on {node}: A gives the core back")
                else:
                    k = "1" if what == "shrink" else "2"
                    subprocess.run(["scontrol", "update", f"JobId={jobs['A']}",
                                    f"Comment=malleable:cpus={k}"], check=True, env=env)
                    say(f"scontrol update JobId={jobs['A']} Comment=malleable:cpus={k}")
            rows = collect_status(store)
            for name, job_id in jobs.items():   # the records go with the job: keep the last
                seen = read_job_statuses(cluster.run_layout, job_id)
                if seen:
                    rates[name] = {f"rank {st.rank}": {str(k): round(v, 2) for k, v in
                                                       sorted(st.steps_per_s.items())}
                                   for st in seen}
            for r in rows:
                if r.current_cpus == "?":
                    continue      # the node's agent has not reported this job yet
                timeline.append({"t": round(now, 2), "job": r.job_id, "node": r.node,
                                 "cores": len(_cpus(r.current_cpus)), "threads": r.threads})
            table = format_table(rows)
            if live:
                print("\033[2J\033[H" + table, flush=True)
            elif int(now) % 10 == 0:
                print(table, flush=True)
            states = {k: client.job(v).state for k, v in jobs.items()}
            if not events and all(not s.holds_cores and s is not JobState.PENDING
                                  for s in states.values()):
                break
            if now > 420:
                say("time is up: cancelling what still runs")
                break
            time.sleep(1.0)
        summary = summarize(cluster, jobs, timeline, rates)
        (out_dir / "demo-summary.json").write_text(json.dumps(summary, indent=2))
        png = out_dir / "demo-timeline.png"
        plot(timeline, jobs, png)
        print_summary(summary)
        say(f"timeline: {png}")
        say(f"all done in {time.monotonic() - t0:.0f}s")
        ok = all(s["state"] == "COMPLETED" for s in summary.values())
        return 0 if ok else 1
    finally:
        problems = cluster.down()
        say("cluster down" + (f", problems: {problems}" if problems else ", nothing left behind"))


def _cpus(text: str) -> list[int]:
    from malleable_protocol.cpulist import parse_cpu_list
    return sorted(parse_cpu_list(text)) if text and text != "-" else []


def summarize(cluster: LocalCluster, jobs: dict[str, int], timeline: list[dict],
              rates_by_job: dict[str, dict]) -> dict:
    client = cluster.client()
    out = {}
    for name, job_id in jobs.items():
        job = client.job(job_id)
        points = [p for p in timeline if p["job"] == job_id]
        per_node: dict[str, list[int]] = {}
        for p in points:
            per_node.setdefault(p["node"], []).append(p["cores"])
        rates = rates_by_job.get(name, {})
        outputs = sorted(cluster.paths.root.glob(f"{name}-{job_id}.out"))  # the templates' output=
        done = [line for f in outputs for line in f.read_text().splitlines()
                if line.startswith("[train] done")]
        out[name] = {"job_id": job_id, "state": job.state.value,
                     "seconds_seen_running": round(points[-1]["t"] - points[0]["t"], 1) if points else 0,
                     "cores_over_time": {n: {"min": min(v), "max": max(v),
                                             "mean": round(sum(v) / len(v), 2)}
                                         for n, v in per_node.items()},
                     "steps_per_s_by_threads": rates, "result": done[0] if done else None}
    return out


def print_summary(summary: dict) -> None:
    print("\nSummary")
    print(f"{'JOB':<4} {'ID':>4} {'STATE':<10} {'SECONDS':>7}  CORES PER NODE (min/mean/max)   STEPS/S BY THREADS")
    for name, s in summary.items():
        cores = ", ".join(f"{n} {c['min']}/{c['mean']}/{c['max']}" for n, c in s["cores_over_time"].items())
        rates = "; ".join(f"{r}: " + ", ".join(f"{k}t {v:.0f}" for k, v in d.items())
                          for r, d in s["steps_per_s_by_threads"].items())
        print(f"{name:<4} {s['job_id']:>4} {s['state']:<10} {s['seconds_seen_running']:>7}  "
              f"{cores:<31} {rates}")
        if s["result"]:
            print(f"     {s['result']}")


def plot(timeline: list[dict], jobs: dict[str, int], png: Path) -> None:
    from slurm_plugin.timeline import plot_stacked
    plot_stacked(timeline, {job_id: name for name, job_id in jobs.items()}, png,
                 cores_per_node=max(2, os.cpu_count() or 2),
                 title="Cores per job per node, stacked (cgroup cpusets set by the co-scheduler;"
                       " seconds since job A was submitted)")


if __name__ == "__main__":
    sys.exit(main())
