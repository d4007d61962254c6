"""``malleable-srun``: run a Horovod TensorFlow program under srun with what malleability needs.

    malleable-srun [--local N] [srun options] PROGRAM [ARGS...]

Inside an allocation (sbatch, salloc) it runs ``srun --mpi=pmix --cpu-bind=none`` (the cgroup,
which the co-scheduler resizes, stays in charge of CPUs; a launch binding would not widen when
the cgroup grows) with every other srun option passed through, and sets for each rank:

- MALLEABLE_TF_MAX_THREADS=node: each rank's pool is as large as its node's cores (the agent
  never gives a job more than its max= bound, so the extra threads stay parked);
- MALLEABLE_TF_STATUS / MALLEABLE_TF_TARGET: the rank's status record and its node's target,
  where ``malleable_protocol.RunLayout`` puts them under $MALLEABLE_RUN_DIR (/run/malleable);
- MALLEABLE_TF_ALLOWANCE=cgroup.

It asks slurmctld nothing. The job's folder for status records is made by the Prolog for the
job's user; without it (no co-scheduler on the cluster) the ranks still follow their cpusets and
run without status records. Outside an allocation it says so, or with ``--local N`` runs N
ranks here under mpirun.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from malleable_protocol import RunLayout
from malleable_protocol.layout import DEFAULT_RUN_DIR


class LaunchError(RuntimeError):
    pass


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    status_dir: Path | None     # where the rank records go (None: no co-scheduler folder)


def malleable_env(layout: RunLayout, job_id: int) -> dict[str, str]:
    return {"MALLEABLE_TF_STATUS": str(layout.status_file(job_id, "{rank}")),
            "MALLEABLE_TF_TARGET": str(layout.target_file(job_id, "{node}")),
            "MALLEABLE_TF_ALLOWANCE": "cgroup", "MALLEABLE_TF_MAX_THREADS": "node"}


def plan_launch(args: list[str], environ: dict[str, str], *, which=shutil.which,
                is_dir=os.path.isdir) -> LaunchPlan:
    layout = RunLayout(Path(environ.get("MALLEABLE_RUN_DIR", str(DEFAULT_RUN_DIR))))
    if args[:1] == ["--local"]:
        if len(args) < 3 or not args[1].isdigit() or int(args[1]) < 1:
            raise LaunchError("usage: malleable-srun --local N PROGRAM [ARGS...]")
        mpirun = which("mpirun")
        if mpirun is None:
            raise LaunchError("mpirun not found on PATH (apt-get install openmpi-bin)")
        # No agent here: the records go to a private folder of this user's.
        local = Path(tempfile.mkdtemp(prefix="malleable-local-"))
        env = {"MALLEABLE_TF_STATUS": str(local / RunLayout.status_name("{rank}")),
               "MALLEABLE_TF_ALLOWANCE": "auto"}
        argv = [mpirun, "-np", args[1], "--bind-to", "none", "--oversubscribe"]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        return LaunchPlan(argv + args[2:], env, local)
    job = environ.get("SLURM_JOB_ID")
    if not job:
        raise LaunchError("not inside a Slurm allocation (no SLURM_JOB_ID): run it from an "
                          "sbatch script or salloc, or try it here with --local N")
    if not job.isdigit() or not 0 < int(job) < 2**32:
        raise LaunchError(f"SLURM_JOB_ID={job!r} is not a job id")
    srun = which("srun")
    if srun is None:
        raise LaunchError("srun not found on PATH")
    if any(a.startswith("--cpu-bind") for a in args):
        raise LaunchError("malleable-srun sets --cpu-bind=none itself: the cgroup decides")
    env = malleable_env(layout, int(job))
    status_dir = layout.job_dir(int(job))
    if not is_dir(status_dir):
        del env["MALLEABLE_TF_STATUS"]
        status_dir = None
    return LaunchPlan([srun, "--mpi=pmix", "--cpu-bind=none", *args], env, status_dir)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    try:
        plan = plan_launch(args, dict(os.environ))
    except LaunchError as exc:
        print(f"malleable-srun: {exc}", file=sys.stderr)
        return 2
    if plan.status_dir is None:
        print("malleable-srun: no co-scheduler folder for this job (no Prolog installed?): the "
              "ranks follow their cpusets but write no status records", file=sys.stderr)
    os.execve(plan.argv[0], plan.argv, {**os.environ, **plan.env})
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
