"""Run an unmodified PyTorch training script malleably.

    python -m malleable_torch.run SCRIPT [ARGS...]
    python -m malleable_torch.run -m MODULE [ARGS...]

sets ``torch.distributed``'s env:// rendezvous from the Slurm step where it is unset
(``malleable_torch.distributed``: a script that calls ``dist.init_process_group("gloo")`` runs
under srun as written), calls ``malleable_torch.init()`` with the ranks the launcher gave (srun,
torchrun, mpirun), then runs SCRIPT as ``__main__`` the way ``python SCRIPT ARGS`` would (the
command line and how the script runs are ``malleable_runtime.runner``'s). A script that calls
``malleable_torch.init()`` itself still works: that call returns the running state. Under
torchrun: ``torchrun ... -m malleable_torch.run train.py`` (each worker runs it).
"""
from __future__ import annotations

import os
import sys

from malleable_runtime import runner
from malleable_runtime.settings import Settings


def init_from_launcher(program: runner.Program | None = None) -> object:
    """The rendezvous from the Slurm step, then ``malleable_torch.init()`` with the ranks the
    launcher gave this process; a script's own init() may then join it."""
    import malleable_torch
    from malleable_torch.distributed import rendezvous_env

    rendezvous_env(os.environ)
    launched = Settings.from_env(os.environ)
    state = malleable_torch.init(local_rank=launched.local_rank, local_size=launched.local_size,
                                 rank=launched.rank)
    malleable_torch._joinable = True
    return state


def main(argv: list[str] | None = None) -> int:
    # A lambda: tests replace init_from_launcher on this module.
    return runner.main(argv, prog="malleable_torch.run",
                       start=lambda program: init_from_launcher(program),
                       start_name="malleable_torch.init()", doc=__doc__ or "")


if __name__ == "__main__":
    sys.exit(main())
