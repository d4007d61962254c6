"""What the malleable components ask of slurmctld, counted by slurmctld itself (sdiag).

For each cluster size: a local cluster with the watcher and one agent per node (lend-idle),
then, each after `sdiag -r`:
- idle: every component running, no job, for --seconds;
- agents alone: the watcher frozen (SIGSTOP), for --seconds: what the node agents cost;
- storm: one malleable job running, its owner sends --storm `scontrol update` resizes as fast
  as scontrol returns, then 2 s to settle (counted together).
- accounting: --rigid jobs (one job array) and --malleable jobs that borrow idle cores, all
  run to their end and their usage closed by the watcher; slurmdbd's own counts (`sacctmgr show
  stats`) of the job reads and writes (sacct, sacctmgr) in that time.
`--phantom N` declares N more nodes in slurm.conf (State=DOWN, no slurmd): slurmctld then holds
a cluster of that size, and the watcher publishes a feed for each of its nodes.

Run it with PYTHONPATH pointing at another checkout to count that code's components the same
way (the agents of commit 273e7b9 polled squeue and sinfo themselves).

    python -m benchmarks.cluster.slurmctld_load [--nodes 3 12] [--seconds 20] [--storm 100]
        [--rigid 40] [--malleable 4]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.common import RESULTS, machine, save

import slurm_plugin
from slurm_plugin.cluster import LocalCluster, default_spec

AGENT_TYPES = ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE", "REQUEST_NODE_INFO",
               "REQUEST_NODE_INFO_SINGLE", "REQUEST_PARTITION_INFO", "REQUEST_FED_INFO")


def parse_sdiag(text: str) -> dict[str, int]:
    """RPC counts by message type from `sdiag` (its section "by message type")."""
    section = text.split("statistics by message type", 1)[-1].split("statistics by user", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+)",
                                                  section, re.M)}


def sdiag(env, reset=False) -> dict[str, int]:
    out = subprocess.run(["sdiag", "-r"] if reset else ["sdiag"], env=env, check=True,
                         capture_output=True, text=True, timeout=30).stdout
    return {} if reset else {k: v for k, v in parse_sdiag(out).items()
                             if k != "REQUEST_STATS_INFO"}


# slurmdbd's RPCs for what sacct reads and sacctmgr writes about jobs.
DBD_JOB_TYPES = ("DBD_GET_JOBS_COND", "DBD_MODIFY_JOB")


def dbd_stats(env) -> dict[str, int]:
    """slurmdbd's RPC counts by message type (`sacctmgr show stats`: the same layout as
    sdiag's)."""
    out = subprocess.run(["sacctmgr", "show", "stats"], env=env, check=True,
                         capture_output=True, text=True, timeout=30).stdout
    return parse_sdiag(out)


def accounting_window(cluster: LocalCluster, env, rigid: int, malleable: int) -> dict:
    """``rigid`` jobs (one array) and ``malleable`` jobs that borrow idle cores, run to their
    end; what slurmdbd was asked about jobs meanwhile, and what the watcher closed."""
    usage_log = cluster.agent_config().watcher_feed_dir / "usage.jsonl"
    seen = len(usage_log.read_text().splitlines()) if usage_log.exists() else 0
    before = dbd_stats(env)
    root = cluster.spec.root
    grow = root / "grow.sh"
    grow.write_text("#!/bin/bash\n#SBATCH --comment=malleable:min=1,max=node\n"
                    "#SBATCH --output=/dev/null\nsleep 8\n")
    client = cluster.client()
    names = cluster.spec.node_names
    jobs = [client.submit(grow, ["-c1", f"-w{names[i % len(names)]}"])
            for i in range(malleable)]
    time.sleep(4)               # the malleable jobs grow on their nodes' idle cores, the array's
                                # jobs then take them back
    out = subprocess.run(["sbatch", "--parsable", f"--array=1-{rigid}", "-c1", "-o/dev/null",
                          "--wrap", "sleep 1"], env=env, check=True, capture_output=True,
                         text=True).stdout
    array = int(out.strip().split(";")[0])
    deadline = time.monotonic() + 300
    while True:
        lines = usage_log.read_text().splitlines()[seen:] if usage_log.exists() else []
        # Only this window's jobs (the storm's, cancelled just before, may close in it too).
        ours = [e for e in map(json.loads, lines) if e["job"] in jobs or e["job"] >= array]
        if len(ours) >= rigid + malleable:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(lines)} of {rigid + malleable} jobs' usage closed")
        time.sleep(1)
    after = dbd_stats(env)
    closed = ours
    borrowed = [e for e in closed if e["borrowed_core_s"] or e["lent_core_s"]]
    return {"rigid_jobs": rigid, "malleable_jobs": malleable, "array_job": array,
            "malleable_job_ids": jobs, "closed": len(closed),
            "borrowed_or_lent": len(borrowed),
            "written_to_database": sum(1 for e in borrowed if e["sacct"]),
            "dbd_rpcs": {t: after.get(t, 0) - before.get(t, 0) for t in DBD_JOB_TYPES}}


def window(env, seconds: float, action=None) -> dict:
    sdiag(env, reset=True)
    t0 = time.monotonic()
    if action is not None:
        action()
    time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    counts = sdiag(env)
    elapsed = time.monotonic() - t0
    polls = sum(v for k, v in counts.items() if k in AGENT_TYPES)
    return {"seconds": round(elapsed, 1), "by_type": counts, "component_rpcs": polls,
            "component_rpc_per_s": round(polls / elapsed, 3)}


def measure(nodes: int, seconds: float, storm: int, phantom: int, port_base: int,
            rigid: int = 0, malleable: int = 0) -> dict:
    root = Path(tempfile.mkdtemp(prefix="malleable-sdiag-", dir="/tmp"))
    root.chmod(0o755)
    # With slurmdbd: what the accounting asks of it is counted too.
    spec = replace(default_spec(root, nodes=nodes, port_base=port_base, node_prefix="sd",
                                name="malleablesdiag"),
                   phantom_nodes=phantom, accounting=bool(rigid or malleable))
    cluster = LocalCluster(spec)
    cluster.up(agents="lend-idle", timeout_s=180)
    env = {**os.environ, **cluster.env()}
    out = {"nodes": nodes, "phantom_nodes": phantom}
    try:
        time.sleep(3)     # first feed published, agents cycling
        out["idle"] = window(env, seconds)
        watcher = next((r for r in cluster.records() if r.name == "watcher"), None)
        if watcher is not None:
            os.kill(watcher.pid, signal.SIGSTOP)
            try:
                out["agents_alone"] = window(env, seconds)
            finally:
                os.kill(watcher.pid, signal.SIGCONT)
        job = cluster.client().submit(_script(root), [f"-w{spec.node_names[0]}"])
        deadline = time.monotonic() + 120
        while (state := cluster.client().job(job).state.value) != "RUNNING":
            if time.monotonic() > deadline:
                detail = subprocess.run(["scontrol", "show", "job", str(job)], env=env,
                                        capture_output=True, text=True).stdout
                raise TimeoutError(f"the storm's job did not start ({state}): {detail}")
            time.sleep(0.2)
        time.sleep(2)

        def resize_storm():
            for i in range(storm):
                subprocess.run(["scontrol", "update", f"JobId={job}",
                                f"Comment=malleable:cpus={1 + i % 2}"], env=env, check=True,
                               capture_output=True, timeout=30)
        t0 = time.monotonic()
        # The storm, then 2 s for what it set off (the watcher's polls) to finish.
        out["storm"] = window(env, 0.0, lambda: (resize_storm(), time.sleep(2.0)))
        out["storm"]["resizes"] = storm
        out["storm"]["storm_and_settle_s"] = round(time.monotonic() - t0, 1)
        cluster.client().cancel(job)
        if rigid or malleable:
            out["accounting"] = accounting_window(cluster, env, rigid, malleable)
    finally:
        out["teardown_problems"] = cluster.down()
        shutil.rmtree(root, ignore_errors=True)
    return out


def _script(root: Path) -> Path:
    s = root / "storm.sh"
    s.write_text("#!/bin/bash\n#SBATCH --comment=malleable:min=1,max=node\n"
                 "#SBATCH --output=/dev/null\nsleep 600\n")
    return s


def plot(data: dict, png: Path) -> None:
    """Idle RPC/s and RPCs per 100-resize storm, by cluster size, for each code measured."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    labels = sorted(data["runs"])
    width = 0.8 / max(1, len(labels))
    totals = sorted({s["nodes"] + s["phantom_nodes"] for r in data["runs"].values()
                     for s in r["sizes"]})
    for k, label in enumerate(labels):
        sizes = data["runs"][label]["sizes"]
        xs = [totals.index(s["nodes"] + s["phantom_nodes"]) + k * width for s in sizes]
        axes[0].bar(xs, [max(s["idle"]["component_rpc_per_s"], 1e-3) for s in sizes], width,
                    label=label)
        axes[1].bar(xs, [max(s["storm"]["component_rpcs"], 1e-1) for s in sizes], width,
                    label=label)
    for ax in axes:
        ax.set_xticks([i + width * (len(labels) - 1) / 2 for i in range(len(totals))],
                      [str(t) for t in totals])
    axes[0].set_title("idle: component RPC/s to slurmctld", fontsize=9)
    axes[1].set_title("100 scontrol updates: component RPCs", fontsize=9)
    for ax in axes:
        ax.set_yscale("log")
        ax.set_xlabel("nodes")
        ax.legend(fontsize=8)
    fig.suptitle("What the malleable components ask of slurmctld (sdiag)", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, nargs="+", default=[3, 12])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--storm", type=int, default=100)
    ap.add_argument("--phantom", type=int, default=0,
                    help="also run the largest size with this many more declared nodes")
    ap.add_argument("--rigid", type=int, default=40, help="accounting: rigid jobs (an array)")
    ap.add_argument("--malleable", type=int, default=4, help="accounting: malleable jobs")
    ap.add_argument("--label", default=None, help="name of the result file's entry")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON")
    args = ap.parse_args()
    path = RESULTS / "slurmctld_load.json"
    if args.plot_only:
        plot(json.loads(path.read_text()), RESULTS / "slurmctld_load.png")
        return
    code = str(Path(slurm_plugin.__file__).resolve().parent.parent)
    rev = subprocess.run(["git", "-C", code, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    # Below Linux's ephemeral ports (LocalCluster refuses them); in the range malleable_runtime
    # derives multi-worker ports from, which no job here uses.
    runs = [measure(n, args.seconds, args.storm, 0, 24817 + 200 * i, args.rigid,
                    args.malleable) for i, n in enumerate(args.nodes)]
    if args.phantom:
        runs.append(measure(args.nodes[-1], args.seconds, args.storm, args.phantom, 27817))
    label = args.label or rev
    data = json.loads(path.read_text()) if path.exists() else {"benchmark": "slurmctld_load"}
    data["machine"] = machine()
    data.setdefault("runs", {})[label] = {"code": code, "revision": rev, "sizes": runs}
    save("slurmctld_load", data)
    plot(data, RESULTS / "slurmctld_load.png")
    for r in runs:
        print(json.dumps({"code": label, "nodes": r["nodes"], "phantom": r["phantom_nodes"],
                          "idle_rpc_per_s": r["idle"]["component_rpc_per_s"],
                          "agents_alone_rpc_per_s": r.get("agents_alone", {}).get(
                              "component_rpc_per_s"),
                          "storm_component_rpcs": r["storm"]["component_rpcs"],
                          "storm_by_type": r["storm"]["by_type"],
                          "accounting": r.get("accounting")}))


if __name__ == "__main__":
    main()
