"""``torch.distributed`` from the Slurm step: an unmodified script that calls
``dist.init_process_group("gloo")`` (the env:// rendezvous PyTorch's tutorials use) runs under
``srun python -m malleable_torch.run train.py`` with nothing set by hand.

Where the variables of the env:// rendezvous are unset (MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), they are set from the step's tasks
(``malleable_runtime.slurm_step``): rank 0's node and a port derived from the job and step (or
MALLEABLE_TF_WORKER_PORT). Under torchrun (its workers have TORCHELASTIC_RUN_ID) nothing is set:
torchrun's own rendezvous gave them. A step of one task sets them too, so ``init_process_group``
works alone. Outside a Slurm step nothing is set.
"""
from __future__ import annotations

import functools
from typing import Callable, MutableMapping

from malleable_runtime.allowance import TORCHRUN_MARK
from malleable_runtime.slurm_step import node_address, slurm_workers

RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
              "LOCAL_WORLD_SIZE")


def rendezvous_env(environ: MutableMapping[str, str],
                   resolve: Callable[[str], str] = functools.cache(node_address)) -> dict[str, str]:
    """Set the env:// rendezvous of the Slurm step where unset; returns what was set.
    Raises ``WorkerPlacementError`` when the step's tasks cannot be read."""
    if TORCHRUN_MARK in environ or "SLURM_PROCID" not in environ or \
            all(name in environ for name in RENDEZVOUS):
        return {}
    found = slurm_workers(environ, resolve)
    first = found.workers[0]
    values = {"MASTER_ADDR": first.address, "MASTER_PORT": str(first.port),
              "RANK": str(found.rank), "WORLD_SIZE": str(len(found.workers)),
              "LOCAL_RANK": str(found.local_rank), "LOCAL_WORLD_SIZE": str(found.local_size)}
    added = {k: v for k, v in values.items() if k not in environ}
    environ.update(added)
    return added
