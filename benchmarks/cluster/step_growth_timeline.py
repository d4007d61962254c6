"""Cores and TensorFlow threads over time in one job whose training runs in its batch step, on a
real Slurm node with the co-scheduler (lend-idle, 2 cores): the job (allocation: 1 core) grows
to the idle core, three `srun -n1 true` steps launch in it, a concurrent `srun` step trains
beside the batch step (each gets one core), the owner asks for 1 core and then 2.

Samples every 0.1 s: the job folder's cpuset, each step folder's, and each rank's active intra-op
threads (its status record). Writes benchmarks/results/step_growth_timeline.json and .png.

    python -m benchmarks.cluster.step_growth_timeline
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import REPO, RESULTS, machine, save

from malleable_protocol import parse_cpu_list
from slurm_plugin.cluster import LocalCluster, default_spec
from malleable_policy.model import Policy

TRAIN = REPO / "tests" / "programs" / "train_until.py"
NODE = "tl1"


def sample(cluster: LocalCluster, job_id: int) -> dict:
    folder = cluster.cgroup_layout(NODE).job_dir(0, job_id)
    out = {"job": [], "steps": {}, "threads": {}}
    try:
        out["job"] = sorted(parse_cpu_list((folder / "cpuset.cpus").read_text()))
        for step in sorted(p for p in folder.iterdir() if p.is_dir()):
            out["steps"][step.name] = sorted(parse_cpu_list((step / "cpuset.cpus").read_text()))
    except OSError:
        pass
    for f in cluster.run_layout.job_dir(job_id).glob("rank_*.step_*.json"):
        try:
            out["threads"][f.name.split(".")[1]] = json.loads(f.read_text())["intra_active"]
        except (OSError, ValueError, KeyError):
            pass
    return out


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="malleable-timeline-", dir="/tmp"))
    root.chmod(0o755)
    work = root / "work"
    work.mkdir(mode=0o777)
    cluster = LocalCluster(default_spec(root / "c", nodes=1, port_base=7817, node_prefix="tl",
                                        name="malleabletimeline"))
    (root / "c").mkdir(mode=0o755)
    cluster.up(agents=Policy.LEND_IDLE)
    env = {**os.environ, **cluster.env()}
    script = work / "job.sh"
    script.write_text(f"""#!/bin/bash
{sys.executable} {TRAIN} {work}/stop &
while [ ! -e {work}/go ]; do sleep 0.05; done
for i in 1 2 3; do srun -n1 true; sleep 1.5; done
srun --overlap -n1 {sys.executable} {TRAIN} {work}/stop &
wait
""")
    events, samples, done = [], [], threading.Event()
    t0 = time.time()

    def mark(text: str) -> None:
        events.append({"t": round(time.time() - t0, 2), "event": text})

    try:
        job_id = int(subprocess.run(
            ["sbatch", "--parsable", "-N1", "-c1", f"-w{NODE}", f"-o{work}/out",
             "--comment=malleable:min=1,max=2", str(script)],
            env=env, check=True, capture_output=True, text=True).stdout.split(";")[0])
        mark("sbatch -c1 (python train.py in the batch script)")

        def sampler() -> None:
            while not done.is_set():
                samples.append({"t": round(time.time() - t0, 2), **sample(cluster, job_id)})
                time.sleep(0.1)
        thread = threading.Thread(target=sampler, daemon=True)
        thread.start()

        def wait(pred, what: str, timeout: float = 180) -> None:
            deadline = time.monotonic() + timeout
            while not pred():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what}: {samples[-1:]}")
                time.sleep(0.1)

        wait(lambda: samples and samples[-1]["threads"].get("step_batch") == 2,
             "batch step at 2 threads")
        time.sleep(3)
        (work / "go").touch()
        mark("3 x srun -n1 true, then a concurrent srun step training")
        wait(lambda: len(samples[-1]["threads"]) == 2 and
             all(v == 1 for v in samples[-1]["threads"].values()), "two steps, 1 thread each")
        time.sleep(8)
        for cpus in (1, 2):
            subprocess.run(["scontrol", "update", f"JobId={job_id}",
                            f"Comment=malleable:cpus={cpus}"], env=env, check=True)
            mark(f"scontrol update Comment=malleable:cpus={cpus}")
            time.sleep(6)
        (work / "stop").touch()
        mark("stop")
        wait(lambda: not samples[-1]["job"], "job end", timeout=60)
        done.set()
        thread.join()
    finally:
        done.set()
        (work / "stop").touch()
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)
    data = {"machine": machine(), "job_allocation": [0], "events": events, "samples": samples}
    path = save("step_growth_timeline", data)
    plot(data)
    print(json.dumps(events, indent=1), "->", path)


def plot(data: dict) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    s = data["samples"]
    t = [x["t"] for x in s]
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
    a.step(t, [len(x["job"]) for x in s], where="post", label="job folder", lw=2)
    steps = sorted({k for x in s for k in x["steps"]})
    # Lines that coincide are drawn a little apart, so that each stays visible.
    for i, st in enumerate(steps, 1):
        a.step(t, [len(x["steps"].get(st, [])) - 0.05 * i for x in s], where="post", label=st,
               lw=1)
    a.set_ylabel("cores (steps drawn slightly lower)")
    a.legend(loc="upper right", fontsize=7)
    ranks = sorted({k for x in s for k in x["threads"]})
    for i, st in enumerate(ranks):
        b.step(t, [x["threads"].get(st, 0) - 0.05 * i for x in s], where="post",
               label=f"rank of {st}")
    b.set_ylabel("active intra-op threads")
    b.set_xlabel("seconds")
    b.legend(loc="upper right", fontsize=7)
    for e in data["events"]:
        for ax in (a, b):
            ax.axvline(e["t"], color="grey", lw=0.5, ls="--")
        a.annotate(e["event"][:40], (e["t"], 2.3), fontsize=6, rotation=12)
    a.set_ylim(0, 2.8)
    b.set_ylim(0, 2.5)
    fig.tight_layout()
    path = RESULTS / "step_growth_timeline.png"
    fig.savefig(path, dpi=110)
    return path


if __name__ == "__main__":
    main()
