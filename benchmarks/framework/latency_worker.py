"""Measurement process for resize_latency.py.

    latency_worker.py inproc N   trains a Keras CNN in a thread; the main thread makes N resizes
                                 by API and N by signal and times each until threads settled
    latency_worker.py follow     trains until killed; resizes come from the driver changing the
                                 process's cpuset; the status file records each one
"""
import json
import os
import signal
import sys
import threading
import time

mode = sys.argv[1]
os.environ.setdefault("MALLEABLE_TF_SIGNALS", "USR1=reload,USR2=intra-down,URG=intra-up")
import malleable_tf  # noqa: E402

malleable_tf.init(max_threads=len(os.sched_getaffinity(0)))
from benchmarks.framework.workloads import keras_cnn_step  # noqa: E402

step = keras_cnn_step()
step_times = []
stop = threading.Event()


def train():
    while not stop.is_set():
        t = time.perf_counter()
        step()
        step_times.append(time.perf_counter() - t)


trainer = threading.Thread(target=train, daemon=True)
trainer.start()
time.sleep(2.0)  # warm up: tracing, first steps
rt = malleable_tf.runtime()
lib = rt.pools.lib
pool = rt.intra_pool

if mode == "follow":
    print("READY", flush=True)
    while True:
        time.sleep(0.5)

api, sig = [], []
n = int(sys.argv[2])
for i in range(n):
    target = pool - 1 if i % 2 == 0 else pool   # alternate one parked / none parked
    time.sleep(0.05)
    t = time.perf_counter()
    malleable_tf.set_threads(intra=target)       # returns when the threads have settled
    api.append(time.perf_counter() - t)
for i in range(n):
    down = i % 2 == 0
    want = 1 if down else 0
    time.sleep(0.05)
    t = time.perf_counter()
    os.kill(os.getpid(), signal.SIGUSR2 if down else signal.SIGURG)
    while lib.mtf_parked(0) != want:
        time.sleep(0.0001)
    sig.append(time.perf_counter() - t)
stop.set()
trainer.join()
print("RESULT " + json.dumps({"api_s": api, "signal_s": sig, "step_s": step_times[5:]}), flush=True)
