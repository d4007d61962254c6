"""One job of the reference workload: a fixed number of training steps, then a JSON line.

    job.py WORKLOAD STEPS malleable|plain|plain-noautotune

malleable: ``malleable_tf.init()`` (inside a job of the co-scheduler it joins it: its threads
follow the cores the agent gives the job). plain: TensorFlow with as many threads as Slurm
allocated (SLURM_CPUS_PER_TASK), which never change: with the agent moving the cgroup, that is
the cgroup-only regime. plain-noautotune: plain, its tf.data pipeline without tf.data's
autotuner, as malleable_tf.data runs its own (TensorFlow's teardown race avoided alike). Prints "RESULT {json}": steps, start and end (epoch s), CPU seconds.
"""
import json
import os
import sys
import time

workload, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
start = time.time()
data_map = None
count = None
if mode == "malleable":
    import malleable_tf
    import malleable_tf.data
    malleable_tf.init()
    data_map = malleable_tf.data.map
    count = malleable_tf.step if workload == "tf_data" else None   # Keras steps count alone
else:
    import tensorflow as tf
    n = int(os.environ.get("SLURM_CPUS_PER_TASK", "1"))
    tf.config.threading.set_intra_op_parallelism_threads(n)
    tf.config.threading.set_inter_op_parallelism_threads(n)

from benchmarks.framework.workloads import WORKLOADS  # noqa: E402

if mode == "plain-noautotune" and workload == "tf_data":
    step = WORKLOADS[workload](data_map, autotune=False)
else:
    step = WORKLOADS[workload](data_map)
ready = time.time()
for _ in range(steps):
    step()
    if count is not None:
        count()
end = time.time()
print("RESULT " + json.dumps({"workload": workload, "steps": steps, "mode": mode, "start": start,
                              "ready": ready, "end": end, "cpu_s": time.process_time()}),
      flush=True)
