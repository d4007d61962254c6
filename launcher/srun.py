"""``malleable-srun``: run a Horovod TensorFlow program under srun with PMIx.

This first version passes its arguments to ``srun --mpi=pmix``; the launcher issue adds the
pool sizes, status paths and CPU binding that malleable ranks need.
"""
from __future__ import annotations

import os
import shutil
import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: malleable-srun [srun options] PROGRAM [ARGS...]\n"
              "Runs PROGRAM with 'srun --mpi=pmix' inside a Slurm allocation.")
        return 0 if args else 2
    if "SLURM_JOB_ID" not in os.environ:
        print("malleable-srun: not inside a Slurm allocation (no SLURM_JOB_ID): "
              "run it from sbatch or salloc", file=sys.stderr)
        return 2
    srun = shutil.which("srun")
    if srun is None:
        print("malleable-srun: srun not found on PATH", file=sys.stderr)
        return 2
    os.execv(srun, [srun, "--mpi=pmix", *args])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
