"""How long a new job step (`srun -n1 true`) takes to launch, on real Slurm clusters, four
rows side by side in one run:

- plain: Slurm without the SPANK plugin (a cluster of its own, with the same hooks, agents and
  watcher running, and an empty plugstack.conf): the baseline;
- rigid: the co-scheduler running (SPANK plugin, Prolog, agents), a job that did not ask for
  malleability;
- malleable_not_grown: a malleable job that cannot grow (--malleable=1:1);
- grown: a malleable job grown to 2 cores (its allocation is 1): the step start brings it back
  to its allocation first, the step launches, the agent grows it again. Each srun starts only
  once the job has grown again;
- rigid_agents_down: a rigid job on a third cluster whose agents and watcher were stopped once
  it was up (the co-scheduler down, its feed going stale): what a job that did not ask pays
  then (issue 40: within 20 ms of rigid's p50).

The clusters (three nodes each) run at once and the four jobs take turns, one srun at a time, so the machine's
load drifts hit every row alike. The plugin decides in C: rigid and ungrown jobs start their
steps with no process started (a gate file and a fence under the node's lock); a grown job's
step asks the running agent on its socket.

    python -m benchmarks.node.step_launch [--steps 20]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import RESULTS, machine, median, percentile, save

from slurm_plugin.cluster import LocalCluster, default_spec
from malleable_policy.model import Policy

# Each srun waits for a turn file, so the jobs alternate; a "grown" job also waits until its
# folder holds 2 cores again.
SCRIPT = """#!/bin/bash
folder=/sys/fs/cgroup/cpuset$(dirname "$(cat /proc/self/cpuset)")
for i in $(seq 1 {steps}); do
  while [ ! -e {turns}/{name}.$i ]; do sleep 0.02; done
  if [ {grow} = 1 ]; then
    until [ "$(cat $folder/cpuset.cpus)" = 0-1 ]; do sleep 0.02; done
  fi
  before=$(cat $folder/cpuset.cpus)
  s=$EPOCHREALTIME; srun -n1 true; rc=$?; e=$EPOCHREALTIME
  echo "step $i rc=$rc start=$s end=$e before=$before after=$(cat $folder/cpuset.cpus)"
  touch {turns}/{name}.$i.done
done
"""


def submit(cluster: LocalCluster, root: Path, turns: Path,
           jobs: dict[str, tuple[str, str, bool]], steps: int) -> dict[str, Path]:
    """``jobs``: name -> (node, sbatch option or "", grows). Returns each job's output file."""
    env = {**os.environ, **cluster.env()}
    outs = {}
    for name, (node, option, grow) in jobs.items():
        script = root / f"{name}.sh"
        script.write_text(SCRIPT.format(steps=steps, turns=turns, name=name,
                                        grow=1 if grow else 0))
        outs[name] = root / f"{name}.out"
        args = ["sbatch", "--parsable", "-N1", "-c1", f"-w{node}", f"-o{outs[name]}"]
        if option:
            args.append(option)
        subprocess.run([*args, str(script)], env=env, check=True, capture_output=True, text=True)
    return outs


def take_turns(turns: Path, outs: dict[str, Path], steps: int) -> dict[str, list[float]]:
    """One srun at a time, the jobs alternating; each job's srun times (s)."""
    for i in range(1, steps + 1):
        for name in outs:
            (turns / f"{name}.{i}").touch()
            deadline = time.monotonic() + 120
            while not (turns / f"{name}.{i}.done").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} step {i}: "
                                       f"{outs[name].read_text() if outs[name].exists() else ''}")
                time.sleep(0.01)
    out = {}
    for name, path in outs.items():
        text = path.read_text()
        rows = re.findall(r"step \d+ rc=(\d+) start=([\d.]+) end=([\d.]+) before=(\S+) "
                          r"after=(\S+)", text)
        if len(rows) != steps or any(rc != "0" for rc, *_ in rows):
            raise RuntimeError(f"{name}: a step failed to launch:\n{text[-2000:]}")
        out[name] = [float(e) - float(s) for _, s, e, _, _ in rows]
        out[name + " cpus before"] = sorted({b for *_, b, _ in rows})
        out[name + " cpus after"] = sorted({a for *_, a in rows})
    return out


def cluster_at(root: Path, port: int, prefix: str, *, plugin: bool) -> LocalCluster:
    """Three nodes with the co-scheduler running (hooks, agents, watcher); ``plugin`` False:
    the SPANK plugin taken out (an empty plugstack.conf, which srun and slurmstepd read at each
    start), so the plain row differs from the others by the plugin alone, not by the daemons
    sharing the machine."""
    root.mkdir(mode=0o755)
    c = LocalCluster(default_spec(root, nodes=3, port_base=port, node_prefix=prefix,
                                  name=f"malleable{prefix}"))
    try:
        c.up(agents=Policy.LEND_IDLE)
    except BaseException:
        c.down()
        raise
    if not plugin:
        (c.hooks_dir / "plugstack.conf").write_text("")
    return c


def plot(data: dict) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(data["seconds"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.boxplot([[x * 1000 for x in data["seconds"][n]] for n in names], tick_labels=names)
    ax.set_ylabel("srun -n1 true (ms)")
    ax.set_title("Step launch: plain Slurm; jobs with the plugin; rigid with agents down",
                 fontsize=9)
    fig.tight_layout()
    path = RESULTS / "step_launch.png"
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="malleable-steps-", dir="/tmp"))
    base.chmod(0o755)
    turns = base / "turns"
    turns.mkdir(mode=0o777)
    clusters = []
    try:
        plain = cluster_at(base / "plain", 9817, "pl", plugin=False)
        clusters.append(plain)
        co = cluster_at(base / "co", 10017, "sl", plugin=True)   # 200 ports apart
        clusters.append(co)
        outs = submit(plain, base / "plain", turns, {"plain": ("pl1", "", False)}, args.steps)
        down = cluster_at(base / "down", 10217, "dn", plugin=True)
        clusters.append(down)
        down.stop_daemons(["watcher"] + [f"agent {n}" for n in down.spec.node_names])
        outs.update(submit(co, base / "co", turns, {
            "rigid": ("sl1", "", False),
            "malleable_not_grown": ("sl2", "--malleable=1:1", False),
            "grown": ("sl3", "--malleable=1:2", True)}, args.steps))
        outs.update(submit(down, base / "down", turns, {"rigid_agents_down": ("dn1", "", False)},
                           args.steps))
        times = take_turns(turns, outs, args.steps)
    finally:
        for c in reversed(clusters):
            c.down()
        shutil.rmtree(base, ignore_errors=True)
    summary = {k: {"p50_s": round(median(v), 3), "p95_s": round(percentile(v, 95), 3),
                   "n": len(v)} for k, v in times.items() if " cpus " not in k}
    plain_p50 = summary["plain"]["p50_s"]
    ratios = {f"{k} / plain (p50)": round(v["p50_s"] / plain_p50, 2)
              for k, v in summary.items() if k != "plain"}
    over_plain_ms = {k: {"p50": round((v["p50_s"] - plain_p50) * 1000, 1),
                         "p95": round((v["p95_s"] - summary["plain"]["p95_s"]) * 1000, 1)}
                     for k, v in summary.items() if k != "plain"}
    down_ms = round((summary["rigid_agents_down"]["p50_s"] - summary["rigid"]["p50_s"]) * 1000, 1)
    data = {"machine": machine(), "steps": args.steps, "summary": summary, "ratios": ratios,
            "ms over plain": over_plain_ms,
            "rigid_agents_down - rigid (p50, ms)": down_ms, "goal_ms": 20,
            "job cores before each srun": {k.split(" ")[0]: v for k, v in times.items()
                                           if k.endswith("cpus before")},
            "job cores right after each srun": {k.split(" ")[0]: v for k, v in times.items()
                                                if k.endswith("cpus after")},
            "seconds": {k: [round(x, 4) for x in v] for k, v in times.items()
                        if " cpus " not in k}}
    path = save("step_launch", data)
    plot(data)
    for k, v in summary.items():
        print(f"{k:20s} p50 {v['p50_s'] * 1000:.0f} ms  p95 {v['p95_s'] * 1000:.0f} ms")
    print(ratios, over_plain_ms, f"agents down: {down_ms:+.1f} ms (p50)", "->", path)


if __name__ == "__main__":
    main()
