"""Horovod with DistributedGradientTape (no Keras fit) under mpirun: trains until a stop file
appears; each rank writes its status where MALLEABLE_TF_STATUS says. argv: STOP_FILE."""
import os
import sys

import malleable_tf.horovod as mh

mh.init(max_threads=2)
import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

import malleable_tf  # noqa: E402

stop_file = sys.argv[1]
tf.random.set_seed(hvd.rank())
x = tf.random.normal((256, 8))
y = tf.reduce_sum(x, axis=1, keepdims=True)
w = tf.Variable(tf.zeros((8, 1)))
opt = tf.keras.optimizers.SGD(0.05)
hvd.broadcast_variables([w], root_rank=0)


@tf.function
def step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, [w])
    opt.apply_gradients(zip(grads, [w]))
    return loss


first = last = None
rt = malleable_tf.runtime()
for i in range(100000):
    last = float(step())
    first = last if first is None else first
    if i % 50 == 0:
        rt.write_status()
        # At least 200 steps, whenever the stop file comes; the same i on every rank.
        if i >= 200 and hvd.allreduce(tf.constant(float(os.path.exists(stop_file))),
                                      op=hvd.Max) > 0:
            break
# Gradients were averaged: every rank holds the same weights.
same = hvd.allreduce(w, op=hvd.Max) - hvd.allreduce(w, op=hvd.Min)
print(f"rank {hvd.rank()} steps {i} first_loss {first:.5f} last_loss {last:.5f} "
      f"weights_equal {bool(tf.reduce_all(tf.abs(same) < 1e-6))}", flush=True)
