"""Trains a small Keras model while 1,000 random resizes arrive from threads and signals.

argv: storm|calm [EPOCHS]. The storm run trains epoch after epoch (at least 4) until 1,000
resizes have arrived during training, and says how many epochs it took; the calm run trains
that many. Prints the losses; the test compares the two.
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
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 4
done = threading.Event()
counts = {"api": 0, "signals": 0, "errors": 0}
lock = threading.Lock()


def api_storm(seed):
    r = random.Random(seed)
    while not done.is_set():
        try:
            malleable_tf.set_threads(intra=r.randint(1, 4), inter=r.randint(1, 4))
        except Exception:  # noqa: BLE001 - every failure is counted; the test wants none
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
loss = []
while len(loss) < epochs or (storm and any(t.is_alive() for t in threads) and len(loss) < 500):
    loss += model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False).history["loss"]
done.set()
for t in threads:
    t.join()
state = malleable_tf.threads()
print("RESULT " + json.dumps({"loss": loss, "counts": counts,
                              "final_intra": state.intra_active, "seconds": time.time() - t0}),
      flush=True)
