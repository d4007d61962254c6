"""Trains a small Keras model while 1,000 random resizes arrive from threads and signals.

argv: storm|calm. Prints the final loss; the test compares the two.
"""
import json
import os
import random
import signal
import sys
import threading
import time

os.environ["MALLEABLE_TF_SIGNALS"] = "USR1=reload,USR2=intra-down,URG=intra-up"
import malleable_tf  # noqa: E402

malleable_tf.init(max_threads=4)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.keras.utils.set_random_seed(0)
tf.config.experimental.enable_op_determinism()
rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 20)).astype("float32")
w = rng.normal(size=(20, 1)).astype("float32")
y = (x @ w + 0.1 * rng.normal(size=(2048, 1))).astype("float32")
model = tf.keras.Sequential([tf.keras.layers.Input((20,)), tf.keras.layers.Dense(64, activation="relu"),
                             tf.keras.layers.Dense(1)])
model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")

storm = sys.argv[1] == "storm"
done = threading.Event()
counts = {"api": 0, "signals": 0, "errors": 0}
lock = threading.Lock()


def api_storm(seed):
    r = random.Random(seed)
    while not done.is_set():
        try:
            malleable_tf.set_threads(intra=r.randint(1, 4), inter=r.randint(1, 4))
        except Exception:
            with lock:
                counts["errors"] += 1
        with lock:
            counts["api"] += 1
            if counts["api"] + counts["signals"] >= 1000:
                return
        time.sleep(r.random() * 0.004)


def signal_storm(seed):
    r = random.Random(seed)
    sigs = [signal.SIGUSR1, signal.SIGUSR2, signal.SIGURG]
    while not done.is_set():
        os.kill(os.getpid(), r.choice(sigs))
        with lock:
            counts["signals"] += 1
            if counts["api"] + counts["signals"] >= 1000:
                return
        time.sleep(r.random() * 0.004)


threads = []
if storm:
    threads = [threading.Thread(target=api_storm, args=(i,)) for i in range(3)] + \
              [threading.Thread(target=signal_storm, args=(10 + i,)) for i in range(2)]
    for t in threads:
        t.start()
t0 = time.time()
hist = model.fit(x, y, batch_size=32, epochs=4, verbose=0, shuffle=False)
done.set()
for t in threads:
    t.join()
state = malleable_tf.threads()
print("RESULT " + json.dumps({"loss": hist.history["loss"], "counts": counts,
                              "final_intra": state.intra_active, "seconds": time.time() - t0}),
      flush=True)
