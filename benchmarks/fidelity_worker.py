"""One measuring process for fidelity.py (a BurstWorker): steps/s of one configuration.

    fidelity_worker.py plain N        TensorFlow started with N threads, pinned to N cores
    fidelity_worker.py malleable N M  malleable_tf with pools of M, N active, pinned to N cores,
                                      tf.data map functions gated (malleable_tf.data)
"""
import json
import os
import sys

mode, n = sys.argv[1], int(sys.argv[2])
cpus = set(sorted(os.sched_getaffinity(0))[:n])
os.sched_setaffinity(0, cpus)  # before TensorFlow starts any thread: all inherit it

map_wrapper = None
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
    import malleable_tf.data
    map_wrapper = malleable_tf.data.gate

from workloads import WORKLOADS, steps_per_second  # noqa: E402

steps = {name: make(map_wrapper) for name, make in WORKLOADS.items()}
for step in steps.values():
    steps_per_second(step, seconds=0.5)  # trace, compile, warm caches
print("READY", flush=True)
for line in sys.stdin:
    workload, seconds = line.split()
    rate = steps_per_second(steps[workload], seconds=float(seconds), warmup=1)
    print("RESULT " + json.dumps(rate), flush=True)
