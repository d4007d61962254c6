"""A Horovod Keras training run that goes on until a stop file appears (all ranks agree).

argv: STOP_FILE [MAX_EPOCHS]. Status records go where MALLEABLE_TF_STATUS says.
"""
import os
import sys

import malleable_tf.horovod as mh

# Launched by malleable-srun, the pool size comes from MALLEABLE_TF_MAX_THREADS; else 2.
mh.init(max_threads=None if "MALLEABLE_TF_MAX_THREADS" in os.environ else 2)
import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from malleable_tf.keras import MalleableCallback  # noqa: E402

stop_file = sys.argv[1]
max_epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 400
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(512, 16)).astype("float32")
y = (x @ np.linspace(-1, 1, 16).astype("float32")[:, None]).astype("float32")
model = tf.keras.Sequential([tf.keras.layers.Input((16,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse")


min_epochs = int(os.environ.get("MIN_EPOCHS", "3"))


class StopTogether(tf.keras.callbacks.Callback):
    """Every rank stops at the same epoch, not before ``MIN_EPOCHS`` (so a loss trend exists):
    the stop decision is an allreduce."""

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 < min_epochs:
            return
        seen = float(os.path.exists(stop_file))
        if hvd_tf.allreduce(tf.constant(seen), op=hvd_tf.Max).numpy() > 0:
            self.model.stop_training = True


hist = model.fit(x, y, batch_size=32, epochs=max_epochs, verbose=0,
                 callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                            MalleableCallback(verbose=False), StopTogether()])
losses = hist.history["loss"]
print(f"rank {hvd.rank()} epochs {len(losses)} first_loss {losses[0]:.5f} last_loss {losses[-1]:.5f}",
      flush=True)
