"""A tf.data pipeline made while the process may use one core, which then gets a second one.
argv[1]: "map" (malleable_tf.data.map: gate and a private pool of the inter-op pool's size) or
"gate" (the gate alone: TensorFlow's own pool, sized by the one core at the start). Prints, for
1 core then 2, the most gated map calls at once. Prints one RESULT JSON line."""
import json
import os
import sys
import threading
import time

os.sched_setaffinity(0, {0})     # before TensorFlow: every thread starts on core 0
import malleable_tf  # noqa: E402
import malleable_tf.data  # noqa: E402
from malleable_runtime.runtime import pin_all_threads  # noqa: E402

malleable_tf.init(max_threads=2)
import tensorflow as tf  # noqa: E402
from tf_data_work import heavy  # noqa: E402


source = tf.data.Dataset.range(10**9)
if sys.argv[1] == "map":
    ds = malleable_tf.data.map(source, heavy, num_parallel_calls=tf.data.AUTOTUNE)
else:
    ds = source.map(malleable_tf.data.gate(heavy), num_parallel_calls=tf.data.AUTOTUNE)
ds = ds.prefetch(2)
stop = threading.Event()


def consume():
    for _ in ds:
        if stop.is_set():
            break


threading.Thread(target=consume, daemon=True).start()
out = {"runs": []}
for cores in ({0}, {0, 1}):
    pin_all_threads(frozenset(cores))   # from "outside": the runtime follows the affinity
    deadline = time.monotonic() + 10
    while malleable_tf.threads().inter_active != len(cores) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(3.0)   # AUTOTUNE raises the parallelism as far as the pipeline's pool allows
    malleable_tf.data.reset_max()
    time.sleep(3.0)
    out["runs"].append({"cores": len(cores), "inter": malleable_tf.threads().inter_active,
                        "max_in_use": malleable_tf.data.stats()["max_in_use"]})
stop.set()
print("RESULT " + json.dumps(out), flush=True)
