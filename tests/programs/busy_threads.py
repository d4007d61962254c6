"""Prints, as JSON, how many threads run during a matmul loop at each intra-op thread count.

Run in its own process: malleable_tf.init() sizes TensorFlow's pools once per process.
"""
import json
import sys
import threading

import malleable_tf
from malleable_tf.procstat import busy_threads, thread_cpu_ticks

POOL = int(sys.argv[1])
malleable_tf.init(max_threads=POOL, inter_max_threads=1, follow=False)
import tensorflow as tf  # noqa: E402

a = tf.random.normal((512, 512))
stop = threading.Event()


@tf.function
def work(x):
    for _ in range(4):
        x = tf.matmul(x, a) / 23.0
    return x


def loop():
    while not stop.is_set():
        work(a).numpy()


worker = threading.Thread(target=loop)
worker.start()
rt = malleable_tf.runtime()
results = []
for n in list(range(POOL, 0, -1)) + [POOL]:
    malleable_tf.set_threads(intra=n)
    busy_threads(0.2)  # let the change settle
    busy = busy_threads(1.5, min_share=0.05, exclude={threading.get_native_id()})
    import ctypes
    buf = (ctypes.c_long * 64)()
    k = rt.native_lib.mtf_parked_tids(0, buf, 64)
    parked = [buf[i] for i in range(k)]
    before = thread_cpu_ticks()
    import time
    time.sleep(1.0)
    after = thread_cpu_ticks()
    parked_ticks = sum(after.get(t, 0) - before.get(t, 0) for t in parked)
    results.append({"active": n, "busy": len(busy), "parked": len(parked),
                    "parked_overlap_busy": len(set(parked) & set(busy)),
                    "parked_cpu_ticks": parked_ticks,
                    "split_width": rt.native_lib.mtf_split_width()})
stop.set()
worker.join()
print("RESULT " + json.dumps(results), flush=True)
