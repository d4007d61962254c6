"""One measurement process for fidelity.py: prints one JSON line of steps/s per workload.

    fidelity_worker.py plain N        TensorFlow started with N threads, pinned to N cores
    fidelity_worker.py malleable N M  malleable_tf with pools of M, N active, pinned to N cores
"""
import json
import os
import sys

mode, n = sys.argv[1], int(sys.argv[2])
seconds = float(os.environ.get("BENCH_SECONDS", "3"))
cpus = set(sorted(os.sched_getaffinity(0))[:n])
os.sched_setaffinity(0, cpus)  # before TensorFlow starts any thread: all inherit it

if mode == "plain":
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(n)
    tf.config.threading.set_inter_op_parallelism_threads(n)
else:
    import malleable_tf
    pool = int(sys.argv[3])
    # The allowance is N cores; the pools are M threads: following parks M - N of them.
    state = malleable_tf.init(max_threads=pool)
    assert state.intra_active == n and state.intra_pool == pool, state

from workloads import WORKLOADS, steps_per_second  # noqa: E402

out = {name: steps_per_second(make(), seconds=seconds) for name, make in WORKLOADS.items()}
print("RESULT " + json.dumps(out), flush=True)
