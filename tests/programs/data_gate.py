"""A tf.data pipeline whose map calls pass malleable_tf's gate, resized while it runs.

For each inter-op thread count: the most gated calls at once (the native counter) and the CPU
the pipeline's threads used, in cores (from /proc). Prints one RESULT JSON line.
"""
import json
import os
import threading
import time

import malleable_tf
import malleable_tf.data
from malleable_runtime.procstat import CLK_TCK, thread_cpu_ticks

malleable_tf.init(max_threads=2)
import tensorflow as tf  # noqa: E402
from tf_data_work import heavy  # noqa: E402


def failing(i):
    # Every third element fails inside the function, after its ticket was taken.
    tf.debugging.assert_none_equal(i % 3, tf.constant(0, tf.int64))
    return heavy(i)


out = {}
# A function that fails half-way must give its ticket back (the variant's destructor).
bad = malleable_tf.data.map(tf.data.Dataset.range(30), failing, num_parallel_calls=2)
bad = bad.ignore_errors()
out["failing_elements_kept"] = sum(1 for _ in bad)
out["in_use_after_failures"] = malleable_tf.data.stats()["in_use"]

ds = malleable_tf.data.map(tf.data.Dataset.range(10**9), heavy,
                           num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)
# The autotuner is off (its thread can hold the iterator's teardown for its whole period).
out["autotune"] = ds.options().autotune.enabled
stop = threading.Event()
consumer = []


def consume():
    consumer.append(threading.get_native_id())
    for _ in ds:
        if stop.is_set():
            break


before = {int(t) for t in os.listdir("/proc/self/task")}
threading.Thread(target=consume, daemon=True).start()
time.sleep(3)  # let AUTOTUNE raise the parallelism
out["runs"] = []
for inter in (2, 1, 2):
    malleable_tf.set_threads(intra=2, inter=inter)
    time.sleep(0.5)
    malleable_tf.data.reset_max()
    t0, ticks0 = time.monotonic(), thread_cpu_ticks()
    time.sleep(3.0)
    t1, ticks1 = time.monotonic(), thread_cpu_ticks()
    # tf.data's threads: the ones the pipeline started (not the pools, not the consumer).
    used = sum(ticks1[t] - ticks0.get(t, 0) for t in ticks1 if t not in before | set(consumer))
    out["runs"].append({"inter": inter, "max_in_use": malleable_tf.data.stats()["max_in_use"],
                        "capacity": malleable_tf.data.stats()["capacity"],
                        "pipeline_cores": used / CLK_TCK / (t1 - t0)})
stop.set()
time.sleep(0.5)

# Many calls at once on a pool of 2 threads, one ticket: the calls that wait are queued, not
# blocked in a thread (more of them wait than the pool has threads), and deleting the iterator
# cancels them: none waits and no ticket is held afterwards.
malleable_tf.set_threads(intra=2, inter=1)
deep = [iter(malleable_tf.data.map(tf.data.Dataset.range(10**9), heavy, num_parallel_calls=16))]
deep_stop = threading.Event()


def consume_deep():
    while not deep_stop.is_set():
        next(deep[0])


deep_consumer = threading.Thread(target=consume_deep)
deep_consumer.start()
most_waiting = 0
for _ in range(100):
    most_waiting = max(most_waiting, malleable_tf.data.stats()["waiting"])
    time.sleep(0.02)
deep_stop.set()
deep_consumer.join()
deep.clear()     # the iterator's last reference: deleted here
out["deep"] = {"most_waiting": most_waiting, "pool": malleable_tf.runtime().inter_pool,
               "after_delete": malleable_tf.data.stats()}
print("RESULT " + json.dumps(out), flush=True)
