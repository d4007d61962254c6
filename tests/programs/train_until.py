"""Trains a small Keras model until the file argv[1] exists. ``malleable_tf.init()`` with no
arguments: inside a job of the co-scheduler it takes malleable-srun's settings by itself (a
``python train.py`` in a batch script, under salloc, or in any srun)."""
import os
import sys

import malleable_tf

malleable_tf.init()
import tensorflow as tf  # noqa: E402

stop = sys.argv[1]
x = tf.random.stateless_normal((512, 128), seed=(1, 2))
y = tf.reduce_sum(x[:, :8], axis=1, keepdims=True)
model = tf.keras.Sequential([tf.keras.layers.Input((128,)), tf.keras.layers.Dense(256, "relu"),
                             tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
epochs = 0
while not os.path.exists(stop):
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    epochs += 1
print(f"trained {epochs} epochs; threads {malleable_tf.threads()}", flush=True)
