"""Steps counted without help: custom loops and Keras fit, read back from the status record.

argv: loops|fit STATUS_PATH (where the status record is written: the test's own folder).
``loops``: a tf.function train step (GradientTape, optimizer.apply_gradients)
at 2 intra-op threads then at 1, an eager step (Keras 2: with a legacy optimizer; Keras 3:
calling the optimizer's ``apply`` directly), then a loop with no optimizer that calls
malleable_tf.step(); after each phase, the status record's steps. ``fit``:
Model.fit with MalleableCallback, epoch after epoch for a few seconds. Set
MALLEABLE_TF_COUNT_STEPS=0 to count with the callback alone.
"""
import json
import sys
import time
from pathlib import Path

import malleable_tf

status_path = Path(sys.argv[2])
malleable_tf.init(max_threads=2, status_path=status_path)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from malleable_tf.keras import MalleableCallback  # noqa: E402


def status() -> dict:
    try:
        return json.loads(status_path.read_text())
    except (OSError, ValueError):
        return {}


def settle(expected: int, timeout: float = 15.0) -> dict:
    """The status record once its steps reach ``expected`` (the runtime writes it by itself)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = status()
        if s.get("steps", 0) >= expected:
            time.sleep(1.0)   # and stays there: nothing is counted twice
            return status()
        time.sleep(0.1)
    return status()


def for_seconds(fn, seconds: float) -> int:
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        fn()
        n += 1
    return n


rng = np.random.default_rng(0)
x = tf.constant(rng.normal(size=(256, 16)).astype("float32"))
y = tf.reduce_sum(x, axis=1, keepdims=True)
out = {}
if sys.argv[1] == "loops":
    w = tf.Variable(tf.zeros((16, 1)))
    opt = tf.keras.optimizers.SGD(0.01)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
        grads = tape.gradient(loss, [w])
        opt.apply_gradients(zip(grads, [w]))
        return loss

    steps = for_seconds(train_step, 4.0)                 # 2 threads
    malleable_tf.set_threads(intra=1)
    steps += for_seconds(train_step, 4.0)                # 1 thread
    out["tape"] = {"steps": steps, "status": settle(steps)}

    keras3 = hasattr(tf.keras.optimizers.Optimizer, "apply")
    if keras3:   # Keras 3 has no legacy optimizers; its custom loops may call apply()
        eager_opt = tf.keras.optimizers.SGD(0.01)
        apply = lambda grads: eager_opt.apply(grads, [w])  # noqa: E731
    else:
        eager_opt = tf.keras.optimizers.legacy.SGD(0.01)
        apply = lambda grads: eager_opt.apply_gradients(zip(grads, [w]))  # noqa: E731

    def eager_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
        apply(tape.gradient(loss, [w]))

    steps += for_seconds(eager_step, 1.0)
    out["eager"] = {"steps": steps, "status": settle(steps), "keras3": keras3}

    @tf.function
    def manual_step():   # no optimizer: the runtime cannot see this one
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
        w.assign_sub(0.01 * tape.gradient(loss, w))

    def counted_step():
        manual_step()
        malleable_tf.step()

    steps += for_seconds(counted_step, 4.0)
    out["step"] = {"steps": steps, "status": settle(steps)}
else:
    model = tf.keras.Sequential([tf.keras.layers.Input((16,)), tf.keras.layers.Dense(32),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    cb = MalleableCallback(verbose=False)
    end = time.monotonic() + 6.0
    while time.monotonic() < end:
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    out["fit"] = {"steps": sum(e["steps"] for e in cb.history), "status": status(),
                  "settled": settle(10**9, timeout=3.0)}
out["intra"] = malleable_tf.threads().intra_active
out["counts_optimizer_steps"] = malleable_tf.runtime().counts_optimizer_steps
print("RESULT " + json.dumps(out), flush=True)
