"""``malleable-srun``: run a Horovod TensorFlow program under srun with what malleability needs.

    malleable-srun [--local N] [srun options] PROGRAM [ARGS...]

Inside an allocation (sbatch, salloc) it runs ``srun --mpi=pmix --cpu-bind=none`` (the cgroup,
which the co-scheduler resizes, stays in charge of CPUs; a launch binding would not widen when
the cgroup grows) with every other srun option passed through, and sets for each rank:

- MALLEABLE_TF_MAX_THREADS: the pool size, the node's cores or the job's max= bound;
- MALLEABLE_TF_STATUS / MALLEABLE_TF_TARGET: the rank's status record and the job's target file
  under $MALLEABLE_STATUS_BASE/job_<id>/ (where the agent reads them);
- MALLEABLE_TF_ALLOWANCE=cgroup.

Outside an allocation it says so, or with ``--local N`` runs N ranks here under mpirun.
"""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_STATUS_BASE = "/run/malleable/status"


class LaunchError(RuntimeError):
    pass


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]


def malleable_env(job_id: str, status_base: Path, max_threads: int | None) -> dict[str, str]:
    folder = status_base / f"job_{job_id}"
    env = {"MALLEABLE_TF_STATUS": str(folder / "rank_{rank}.json"),
           "MALLEABLE_TF_TARGET": str(folder / "target-{node}.json"),
           "MALLEABLE_TF_ALLOWANCE": "cgroup"}
    if max_threads:
        env["MALLEABLE_TF_MAX_THREADS"] = str(max_threads)
    return env


def job_max_threads(job_id: str, environ: dict[str, str]) -> int | None:
    """The per-rank pool size: the job's max= bound if it has one, else its nodes' cores."""
    from slurm_plugin.coscheduler.reconciler import job_spec_and_request
    from slurm_plugin.slurm import CliSlurmClient
    client = CliSlurmClient()
    job = client.job(int(job_id))
    spec, _ = job_spec_and_request(job)
    node_cores = max((n.cpus for n in client.nodes() if n.name in job.nodes), default=None)
    if spec is not None and spec.max_cpus is not None and node_cores:
        return min(spec.max_cpus, node_cores)
    return node_cores


def plan_launch(args: list[str], environ: dict[str, str], *, which=shutil.which,
                max_threads_of=job_max_threads) -> LaunchPlan:
    status_base = Path(environ.get("MALLEABLE_STATUS_BASE", DEFAULT_STATUS_BASE))
    if args[:1] == ["--local"]:
        if len(args) < 3 or not args[1].isdigit() or int(args[1]) < 1:
            raise LaunchError("usage: malleable-srun --local N PROGRAM [ARGS...]")
        mpirun = which("mpirun")
        if mpirun is None:
            raise LaunchError("mpirun not found on PATH (apt-get install openmpi-bin)")
        env = malleable_env(f"local-{os.getpid()}", status_base, None)
        env["MALLEABLE_TF_ALLOWANCE"] = "auto"
        argv = [mpirun, "-np", args[1], "--bind-to", "none", "--oversubscribe"]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        return LaunchPlan(argv + args[2:], env)
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        raise LaunchError("not inside a Slurm allocation (no SLURM_JOB_ID): run it from an "
                          "sbatch script or salloc, or try it here with --local N")
    srun = which("srun")
    if srun is None:
        raise LaunchError("srun not found on PATH")
    if any(a.startswith("--cpu-bind") for a in args):
        raise LaunchError("malleable-srun sets --cpu-bind=none itself: the cgroup decides")
    env = malleable_env(job_id, status_base, max_threads_of(job_id, environ))
    return LaunchPlan([srun, "--mpi=pmix", "--cpu-bind=none", *args], env)


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
    folder = Path(plan.env["MALLEABLE_TF_TARGET"]).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"malleable-srun: cannot make the status folder {folder}: {exc}", file=sys.stderr)
        return 2
    os.execve(plan.argv[0], plan.argv, {**os.environ, **plan.env})
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
