"""End-to-end co-scheduler latencies on a real one-node Slurm cluster with its agent:

- resize: `scontrol update JobId=A Comment=malleable:cpus=K` until A's rank runs K threads
  (goal: p50 under 1 s);
- Prolog: the time the Prolog adds to a job's start when its cores were lent to A (goal: under
  0.5 s), as the Prolog itself measures it (its log), with the count of reclaims it made;
- Prolog with slurmctld stopped (SIGSTOP: any call to it would hang): the node's Prolog run as
  slurmd runs it, for a job id slurmctld never made, while A holds lent cores; its wall time,
  and A's cores right after it.

    python -m benchmarks.node.coscheduler_latency [--resizes 30] [--starts 15]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, RESULTS, machine, median, percentile, save

from malleable_protocol import parse_cpu_list
from sbatch_templates import render
from slurm_plugin.cluster import LocalCluster, default_spec
from malleable_policy.model import Policy

PROGRAM = REPO / "tests" / "programs" / "hvd_train.py"


def wait(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.002)
    raise TimeoutError(what)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--resizes", type=int, default=30)
    ap.add_argument("--starts", type=int, default=15)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="malleable-bench-", dir="/tmp"))
    root.chmod(0o755)
    cluster = LocalCluster(default_spec(root, nodes=1, port_base=2817, node_prefix="bn",
                                        name="malleablebench"))
    cluster.up(agents=Policy.LEND_IDLE)
    env = {**os.environ, **cluster.env()}
    stop = root / "stop"
    try:
        script = root / "a.sbatch"
        script.write_text(render("single-node", {
            "program": str(PROGRAM), "args": f"{stop} 10000000", "ntasks": "1",
            "output": f"{root}/a.out", "python": sys.executable,
            "launcher": str(Path(sys.executable).with_name("malleable-srun"))}))
        client = cluster.client()
        a = client.submit(script)
        status = cluster.run_layout.status_file(a, 0)

        def threads():
            try:
                return json.loads(status.read_text())["intra_active"]
            except (OSError, ValueError, KeyError):
                return None

        cores = os.cpu_count()
        wait(lambda: threads() == cores, 180, "A grown")
        resize_s = []
        for i in range(args.resizes):
            k = 1 if i % 2 == 0 else cores
            t0 = time.monotonic()
            subprocess.run(["scontrol", "update", f"JobId={a}", f"Comment=malleable:cpus={k}"],
                           check=True, env=env, capture_output=True)
            wait(lambda: threads() == k, 10, f"A at {k}")
            resize_s.append(time.monotonic() - t0)
            time.sleep(0.3)
        # Give A everything again, then start short jobs on its lent cores.
        subprocess.run(["scontrol", "update", f"JobId={a}", "Comment=malleable:max=node"],
                       check=True, env=env, capture_output=True)
        log = root / "agent" / "hooks-bn1.log"
        for i in range(args.starts):
            wait(lambda: threads() == cores, 10, "A regrown")
            out = subprocess.run(["sbatch", "--parsable", "-N1", "-n1", "--output=/dev/null",
                                  "--wrap=true"], check=True, env=env, capture_output=True,
                                 text=True)
            b = int(out.stdout.strip().split(";")[0])
            wait(lambda: f"prolog job {b}:" in (log.read_text() if log.exists() else ""), 30,
                 f"prolog of {b}")
            wait(lambda: not client.job(b).state.holds_cores, 30, f"{b} done")
        prologs = []
        for line in log.read_text().splitlines():
            m = re.search(r"prolog job (\d+): (\d+) resizes in (\d+) ms", line)
            if m and int(m[1]) != a:
                prologs.append({"job": int(m[1]), "changes": int(m[2]), "ms": int(m[3])})
        lent = [p["ms"] for p in prologs if p["changes"] > 0]
        # The Prolog with slurmctld frozen.
        ctld = next(r for r in cluster.records() if r.name == "slurmctld")
        hooks = cluster.hooks_dir
        job_dir = cluster.cgroup_layout("bn1").cpus_file(0, a)
        stopped = []
        os.kill(ctld.pid, signal.SIGSTOP)
        try:
            for i in range(args.starts):
                wait(lambda: threads() == cores, 10, "A regrown (slurmctld stopped)")
                fake = 900000 + i
                hook_env = {**env, "SLURMD_NODENAME": "bn1", "SLURM_JOB_ID": str(fake),
                            "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0"}
                t0 = time.monotonic()
                pro = subprocess.run([str(hooks / "prolog.sh")], env=hook_env,
                                     capture_output=True, text=True, timeout=30)
                dt = time.monotonic() - t0
                after = job_dir.read_text().strip()
                stopped.append({"ms": round(dt * 1000, 1), "exit": pro.returncode,
                                "a_cores_after": after})
                subprocess.run([str(hooks / "epilog.sh")], env=hook_env, capture_output=True,
                               timeout=30)
        finally:
            os.kill(ctld.pid, signal.SIGCONT)
    finally:
        stop.touch()
        time.sleep(1)
        problems = cluster.down()
        shutil.rmtree(root, ignore_errors=True)
    ms = [x * 1000 for x in resize_s]
    data = {"benchmark": "coscheduler_latency", "machine": machine(), "node_cores": cores,
            "goal": {"resize_p50_s": 1.0, "prolog_s": 0.5}, "agent_interval_s": 0.5,
            "resize_ms": {"n": len(ms), "p50": median(ms), "p95": percentile(ms, 95),
                          "max": max(ms)},
            "prolog_ms_when_cores_were_lent": {"n": len(lent), "p50": median(lent),
                                               "p95": percentile(lent, 95),
                                               "max": max(lent) if lent else None},
            "prolog_with_slurmctld_stopped": {
                "n": len(stopped), "p50_ms": median([s["ms"] for s in stopped]),
                "max_ms": max(s["ms"] for s in stopped),
                "all_exit_0": all(s["exit"] == 0 for s in stopped),
                "a_back_in_its_allocation_every_time":
                    all(len(parse_cpu_list(s["a_cores_after"])) == 1 for s in stopped),
                "runs": stopped},
            "prologs": prologs, "raw_resize_ms": ms, "teardown_problems": problems}
    save("coscheduler_latency", data)
    print(json.dumps({k: data[k] for k in ("resize_ms", "prolog_ms_when_cores_were_lent")}))
    print(json.dumps({k: v for k, v in data["prolog_with_slurmctld_stopped"].items()
                      if k != "runs"}))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.boxplot([ms, lent], tick_labels=["scontrol update\n-> rank threads", "Prolog with\nlent cores"])
    ax.axhline(1000, color="r", ls="--", lw=1, label="goal: resize p50 1 s")
    ax.axhline(500, color="m", ls="--", lw=1, label="goal: Prolog 0.5 s")
    ax.set_ylabel("ms")
    ax.set_title("Co-scheduler latencies, 1-node local Slurm cluster", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "coscheduler_latency.png", dpi=110)


if __name__ == "__main__":
    main()
