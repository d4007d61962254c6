"""The main demo: a local 3-node Slurm cluster runs a real 3-node Horovod job, then goes away.

Run it with `make demo` (which installs everything first). Later issues extend it with the
co-scheduler and malleable training jobs.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from slurm_plugin.cluster import LocalCluster, default_spec  # noqa: E402
from slurm_plugin.cli import format_status  # noqa: E402
from slurm_plugin.slurm import JobState  # noqa: E402


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="/tmp/malleable-demo")
    ap.add_argument("--port-base", type=int, default=18817)
    args = ap.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    cluster = LocalCluster(default_spec(root, nodes=3, port_base=args.port_base))
    t0 = time.monotonic()
    say(f"bringing up a 3-node Slurm cluster in {root}")
    cluster.up(log=say)
    try:
        client = cluster.client()
        script = root / "allreduce.sbatch"
        out = root / "allreduce.out"
        script.write_text(
            "#!/bin/bash\n"
            f"srun --mpi=pmix {sys.executable} -m launcher.allreduce_check\n")
        job_id = client.submit(script, ["-N3", "-n3", "-J", "allreduce", f"--output={out}"])
        say(f"submitted job {job_id}: sbatch -N3 -n3 (one Horovod rank per node)")
        last = None
        while True:
            job = client.job(job_id)
            if job.state is not last:
                say(f"job {job_id}: {job.state.value}")
                if job.state is JobState.RUNNING:
                    print(format_status(cluster.status()), flush=True)
                last = job.state
            if not job.state.holds_cores and job.state is not JobState.PENDING:
                break
            time.sleep(0.5)
        say(f"job output ({out}):")
        print("".join(line for line in out.read_text().splitlines(keepends=True)
                      if "cpu_feature_guard" not in line and "rebuild TensorFlow" not in line
                      and "AVX2" not in line), flush=True)
        ok = job.state is JobState.COMPLETED
        say(f"job {job_id} ended {job.state.value} after {time.monotonic() - t0:.1f}s")
        return 0 if ok else 1
    finally:
        problems = cluster.down()
        say("cluster down" + (f", problems: {problems}" if problems else ", nothing left behind"))


if __name__ == "__main__":
    sys.exit(main())
