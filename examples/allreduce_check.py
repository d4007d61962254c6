"""One Horovod allreduce across every rank of a job; each rank reports where it runs.

Run under srun --mpi=pmix (or mpirun) as `python -m examples.allreduce_check`.
"""
import os
import time

start = time.time()
import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank())]), op=hvd.Sum).numpy()[0]
expected = hvd.size() * (hvd.size() - 1) / 2
print(f"rank {hvd.rank()}/{hvd.size()} on node {os.environ.get('SLURMD_NODENAME', '?')} "
      f"(local rank {hvd.local_rank()}/{hvd.local_size()}), allowed CPUs "
      f"{sorted(os.sched_getaffinity(0))}: allreduce sum {total:g} "
      f"({'ok' if total == expected else f'WRONG, expected {expected:g}'}), {time.time() - start:.1f}s",
      flush=True)
if total != expected:
    raise SystemExit(1)
