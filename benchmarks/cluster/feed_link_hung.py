"""Does a watcher that stops answering hold up job launches? A local cluster on the feed link
(each node's agent with a folder of its own); rigid jobs one at a time, the watcher alternately
running and frozen (SIGSTOP: its TCP connections stay open and unread, as with a hung host),
so the machine's load drifts hit both alike. Per job: sbatch's own time (job_submit.lua, which
appends to the watcher's local event file), submit to the batch script's first line (slurmctld's
PrologSlurmctld, the node's Prolog), and three `srun -n1 true` launches (the SPANK plugin's
step start). Goal (issue 41): p50 within 10% of the healthy run's.

    python -m benchmarks.cluster.feed_link_hung [--jobs 12]
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine, median, percentile, save

from malleable_policy.model import Policy
from slurm_plugin.cluster import LocalCluster, default_spec

SCRIPT = """#!/bin/bash
echo "first $EPOCHREALTIME"
for i in 1 2 3; do
  s=$EPOCHREALTIME; srun -n1 true; rc=$?; e=$EPOCHREALTIME
  echo "step $rc $s $e"
done
echo done
"""


def one_job(c: LocalCluster, folder: Path, name: str) -> dict:
    env = {**os.environ, **c.env()}
    script, out = folder / f"{name}.sh", folder / f"{name}.out"
    script.write_text(SCRIPT)
    t0 = time.time()
    subprocess.run(["sbatch", "--parsable", "-N1", "-c1", "-wlh1", f"-o{out}", str(script)],
                   env=env, check=True, capture_output=True)
    submit = time.time() - t0
    deadline = time.monotonic() + 120
    while not (out.exists() and out.read_text().rstrip().endswith("done")):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not finish: {out.read_text() if out.exists() else ''}")
        time.sleep(0.02)
    lines = out.read_text().splitlines()
    first = float(lines[0].split()[1])
    steps = [float(e) - float(s) for _, rc, s, e in (ln.split() for ln in lines
                                                     if ln.startswith("step ")) if rc == "0"]
    if len(steps) != 3:
        raise RuntimeError(f"{name}: a step failed: {lines}")
    while any(j.state.holds_cores for j in c.client().jobs()):   # the next on an empty node
        time.sleep(0.05)
    return {"submit": submit, "start": first - t0, "step": steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=12, help="per state")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="malleable-hung-", dir="/tmp"))
    base.chmod(0o755)
    c = LocalCluster(default_spec(base / "c", nodes=1, port_base=5817, node_prefix="lh",
                                  name="malleablehung"))
    samples = {s: {"submit": [], "start": [], "step": []} for s in ("healthy", "frozen")}
    try:
        c.up(agents=Policy.LEND_IDLE)
        pid = next(r.pid for r in c.records() if r.name == "watcher")
        one_job(c, base, "warmup")
        for i in range(args.jobs):
            for state in ("healthy", "frozen") if i % 2 == 0 else ("frozen", "healthy"):
                if state == "frozen":
                    os.kill(pid, signal.SIGSTOP)
                try:
                    got = one_job(c, base, f"{state}{i}")
                finally:
                    if state == "frozen":
                        os.kill(pid, signal.SIGCONT)
                for k in ("submit", "start"):
                    samples[state][k].append(got[k])
                samples[state]["step"] += got["step"]
    finally:
        c.down()
        shutil.rmtree(base, ignore_errors=True)
    rows = {}
    for state, d in samples.items():
        rows[state] = {f"{k}_ms_p50": round(median(v) * 1000, 1) for k, v in d.items()}
        rows[state].update({f"{k}_ms_p90": round(percentile(v, 90) * 1000, 1)
                            for k, v in d.items()})
        rows[state]["n"] = {k: len(v) for k, v in d.items()}
    ratios = {k: round(rows["frozen"][f"{k}_ms_p50"] / rows["healthy"][f"{k}_ms_p50"], 3)
              for k in ("submit", "start", "step")}
    print(rows, ratios)
    save("feed_link_hung", {"machine": machine(), "rows": rows,
                            "frozen_over_healthy_p50": ratios,
                            "goal": "each ratio within 0.9-1.1 (issue 41)"})


if __name__ == "__main__":
    main()
