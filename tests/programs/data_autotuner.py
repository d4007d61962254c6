"""Does a pipeline of malleable_tf.data.map run tf.data's autotuner thread? That thread can miss
its cancellation and hold the iterator's teardown for its whole period (up to 60 s).
argv[1]: "map" (malleable_tf.data.map as it is) or "autotune" (the same with
``options(autotune=True)``: the control, which shows the thread is found when it runs). Iterates
for 2 s, then counts this process's threads inside tf.data's Model::OptimizeLoop (gdb's
backtraces). Prints one RESULT JSON line."""
import json
import os
import subprocess
import sys
import time

import malleable_tf
import malleable_tf.data

malleable_tf.init(max_threads=2)
import tensorflow as tf  # noqa: E402
from tf_data_work import heavy  # noqa: E402

source = tf.data.Dataset.range(10**9)
ds = source.map(malleable_tf.data.gate(heavy), num_parallel_calls=tf.data.AUTOTUNE)
ds = ds.with_options(malleable_tf.data.options(autotune=sys.argv[1] == "autotune")).prefetch(2)
it = iter(ds)
deadline = time.monotonic() + 2
elements = 0
while time.monotonic() < deadline:
    next(it)
    elements += 1
bt = subprocess.run(["gdb", "-p", str(os.getpid()), "-batch", "-ex", "thread apply all bt 30"],
                    capture_output=True, text=True, timeout=120).stdout
threads = bt.split("\nThread ")[1:]
print("RESULT " + json.dumps({
    "elements": elements, "threads_seen": len(threads),
    "in_optimize_loop": sum("Model::OptimizeLoop" in t for t in threads)}), flush=True)
