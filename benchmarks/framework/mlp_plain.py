"""Plain TensorFlow (no malleable_tf, no strategy): the MLP of examples/train_multiworker.py in
the same custom loop, on the CPUs this process is given, for ``--seconds``; prints
"RESULT {json}" with its steps/s. multiworker.py's baseline, run at 1 and 2 cores.

    taskset -c 0-1 python mlp_plain.py [--width 1024] [--batch-size 256] [--seconds 6]
"""
import argparse
import json
import os
import time

ap = argparse.ArgumentParser()
ap.add_argument("--width", type=int, default=1024)
ap.add_argument("--batch-size", type=int, default=256)
ap.add_argument("--seconds", type=float, default=6.0)
args = ap.parse_args()

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

rng = np.random.default_rng(0)
x = rng.standard_normal((args.batch_size, 64)).astype("float32")
y = x[:, :10].argmax(axis=1).astype("int64")
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.layers.Input((64,)),
                          keras.layers.Dense(args.width, activation="relu"),
                          keras.layers.Dense(args.width, activation="relu"),
                          keras.layers.Dense(10)])
optimizer = keras.optimizers.SGD(0.05)
loss_of = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def step(a, b):
    with tf.GradientTape() as tape:
        loss = loss_of(b, model(a, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


for _ in range(10):
    step(x, y)
n, t0 = 0, time.monotonic()
while time.monotonic() - t0 < args.seconds:
    float(step(x, y))
    n += 1
print("RESULT " + json.dumps({"cpus": sorted(os.sched_getaffinity(0)),
                              "steps_per_s": n / (time.monotonic() - t0)}))
