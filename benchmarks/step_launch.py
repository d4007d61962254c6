"""How long a new job step (`srun -n1 true`) takes to launch, on a real 2-node Slurm cluster:

- plain: Slurm alone (no hooks, no agents): the baseline;
- not grown: the co-scheduler running (Prolog, SPANK plugin, agents), a malleable job that
  cannot grow (max=1): what the SPANK plugin's step-start hook costs every step;
- grown: the same, a job grown to 2 cores (its allocation is 1): the step-start hook brings it
  back to its allocation first, the step launches, the agent grows it again. Each srun starts
  only once the job has grown again.

The two co-scheduler jobs run side by side on their own nodes and alternate their sruns, so
the machine's load drifts hit both alike.

    python benchmarks/step_launch.py [--steps 20]
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

from common import RESULTS, machine, median, percentile, save

from slurm_plugin.cluster import LocalCluster, default_spec
from slurm_plugin.coscheduler.model import Policy

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


def run_jobs(cluster: LocalCluster, root: Path, jobs: dict[str, tuple[str, str, bool]],
             steps: int) -> dict[str, list[float]]:
    """``jobs``: name -> (node, comment, grows). Returns each job's srun times (s)."""
    env = {**os.environ, **cluster.env()}
    turns = root / "turns"
    turns.mkdir(mode=0o777, exist_ok=True)
    ids = {}
    for name, (node, comment, grow) in jobs.items():
        script = root / f"{name}.sh"
        script.write_text(SCRIPT.format(steps=steps, turns=turns, name=name,
                                        grow=1 if grow else 0))
        args = ["sbatch", "--parsable", "-N1", "-c1", f"-w{node}", f"-o{root}/{name}.out"]
        if comment:
            args.append(f"--comment={comment}")
        ids[name] = int(subprocess.run([*args, str(script)], env=env, check=True,
                                       capture_output=True, text=True).stdout.split(";")[0])
    for i in range(1, steps + 1):
        for name in jobs:                       # one srun at a time, the jobs alternating
            (turns / f"{name}.{i}").touch()
            deadline = time.monotonic() + 60
            while not (turns / f"{name}.{i}.done").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} step {i}: {(root / f'{name}.out').read_text()}")
                time.sleep(0.01)
    out = {}
    for name in jobs:
        text = (root / f"{name}.out").read_text()
        rows = re.findall(r"step \d+ rc=(\d+) start=([\d.]+) end=([\d.]+) before=(\S+) "
                          r"after=(\S+)", text)
        if len(rows) != steps or any(rc != "0" for rc, *_ in rows):
            raise RuntimeError(f"{name}: a step failed to launch:\n{text[-2000:]}")
        out[name] = [float(e) - float(s) for _, s, e, _, _ in rows]
        out[name + " cpus before"] = sorted({b for *_, b, _ in rows})
        out[name + " cpus after"] = sorted({a for *_, a in rows})
    return out


def cluster_at(root: Path, port: int, agents: Policy | None) -> LocalCluster:
    root.mkdir(mode=0o755)
    c = LocalCluster(default_spec(root, nodes=2, port_base=port, node_prefix="sl",
                                  name="malleablestep"))
    c.up(agents=agents)
    return c


def plot(data: dict) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(data["seconds"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.boxplot([[x * 1000 for x in data["seconds"][n]] for n in names], tick_labels=names)
    ax.set_ylabel("srun -n1 true (ms)")
    ax.set_title("Step launch: plain Slurm, co-scheduled job, grown job")
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
    times: dict[str, list[float]] = {}
    try:
        plain = cluster_at(base / "plain", 39817, None)
        try:
            times.update(run_jobs(plain, base / "plain", {"plain": ("sl1", "", False)},
                                  args.steps))
        finally:
            plain.down()
        co = cluster_at(base / "co", 39917, Policy.LEND_IDLE)
        try:
            times.update(run_jobs(co, base / "co", {
                "not_grown": ("sl1", "malleable:min=1,max=1", False),
                "grown": ("sl2", "malleable:min=1,max=2", True)}, args.steps))
        finally:
            co.down()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    summary = {k: {"p50_s": round(median(v), 3), "p95_s": round(percentile(v, 95), 3),
                   "n": len(v)} for k, v in times.items() if " cpus " not in k}
    ratios = {"grown / not_grown (p50)": round(summary["grown"]["p50_s"] /
                                               summary["not_grown"]["p50_s"], 2),
              "not_grown / plain (p50)": round(summary["not_grown"]["p50_s"] /
                                               summary["plain"]["p50_s"], 2)}
    data = {"machine": machine(), "steps": args.steps, "summary": summary, "ratios": ratios,
            "job cores before each srun": {k.split(" ")[0]: v for k, v in times.items()
                                           if k.endswith("cpus before")},
            "job cores right after each srun": {k.split(" ")[0]: v for k, v in times.items()
                                                if k.endswith("cpus after")},
            "seconds": {k: [round(x, 4) for x in v] for k, v in times.items()
                        if " cpus " not in k}}
    path = save("step_launch", data)
    plot(data)
    for k, v in summary.items():
        print(f"{k:10s} p50 {v['p50_s'] * 1000:.0f} ms  p95 {v['p95_s'] * 1000:.0f} ms")
    print(ratios, "->", path)


if __name__ == "__main__":
    main()
