"""Prints, as JSON, how many threads run during a matmul loop at each intra-op thread count.

``busy_threads.py POOL``: malleable_tf with an intra-op pool of POOL, resized to POOL,
POOL-1, .., 1 and back to POOL.
``busy_threads.py --plain N``: plain TensorFlow started with N intra-op threads (no
malleable_tf), the same loop and the same counting: what the malleable process is compared with.

Run in its own process: TensorFlow sizes its pools once per process.
"""
import ctypes
import json
import statistics
import sys
import threading
import time

from malleable_runtime.procstat import busy_threads, thread_cpu_ticks

PLAIN = sys.argv[1] == "--plain"
POOL = int(sys.argv[-1])
SIZE = 1024      # big enough that the threads driving the loop use little CPU next to the kernel
WINDOWS = 3      # busy threads are counted over this many windows; the median is reported
WINDOW_S = 1.0
MIN_SHARE = 0.12  # see the test: between the driving threads (<=6%) and the kernel's (>=20%)

if PLAIN:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(POOL)
    tf.config.threading.set_inter_op_parallelism_threads(1)
else:
    import malleable_tf

    malleable_tf.init(max_threads=POOL, inter_max_threads=1, follow=False)
    import tensorflow as tf  # noqa: E402

a = tf.random.normal((SIZE, SIZE))
stop = threading.Event()


@tf.function
def work(x):
    for _ in range(4):
        x = tf.matmul(x, a) / 23.0
    return x


def loop():
    while not stop.is_set():
        work(a).numpy()


def measure():
    """Over WINDOWS windows: each window's busy threads (procstat.busy_threads, the measuring
    thread left out) and each thread's CPU ticks, busiest first (for the failure message)."""
    me = threading.get_native_id()
    busy, ticks = [], []
    for _ in range(WINDOWS):
        before = thread_cpu_ticks()
        busy.append(busy_threads(WINDOW_S, min_share=MIN_SHARE, exclude={me}))
        after = thread_cpu_ticks()
        ticks.append({t: after[t] - before.get(t, after[t]) for t in after if t != me})
    return busy, ticks


def summary(busy, ticks):
    counts = [len(b) for b in busy]
    return {"busy": int(statistics.median(counts)), "counts": counts,
            "ticks": [sorted((v for v in w.values() if v), reverse=True) for w in ticks]}


worker = threading.Thread(target=loop)
worker.start()
results = []
if PLAIN:
    time.sleep(1.0)  # let the loop get going (the first call traces the function)
    results.append({"threads": POOL, **summary(*measure())})
else:
    rt = malleable_tf.runtime()

    def parked_tids():
        buf = (ctypes.c_long * 64)()
        k = rt.pools.lib.mtf_parked_tids(0, buf, 64)
        return sorted(buf[i] for i in range(k))

    for n in list(range(POOL, 0, -1)) + [POOL]:
        malleable_tf.set_threads(intra=n)
        time.sleep(1.0 if not results else 0.3)  # let the loop get going / the change settle
        parked = parked_tids()
        busy, ticks = measure()
        ever_busy = set().union(*busy)
        results.append({"active": n, **summary(busy, ticks),
                        "parked": len(parked),
                        "parked_changed": parked != parked_tids(),
                        "parked_overlap_busy": len(set(parked) & ever_busy),
                        "parked_cpu_ticks": sum(w.get(t, 0) for w in ticks for t in parked),
                        "split_width": rt.pools.lib.mtf_split_width()})
stop.set()
worker.join()
print("RESULT " + json.dumps(results), flush=True)
