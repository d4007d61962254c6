"""Horovod helpers: each rank takes its share of the node from its local rank and local size."""
from __future__ import annotations

from . import init as _init
from .runtime import ThreadState


def init(max_threads: int | None = None, **kwargs) -> ThreadState:
    """``hvd.init()`` then ``malleable_tf.init()`` with Horovod's rank, local rank and local size.

    Call it before TensorFlow runs its first op, in place of both inits. Works the same under
    ``srun --mpi=pmix``, ``mpirun`` and ``horovodrun``.
    """
    import horovod.tensorflow as hvd

    hvd.init()
    return _init(max_threads, local_rank=hvd.local_rank(), local_size=hvd.local_size(),
                 rank=hvd.rank(), **kwargs)
