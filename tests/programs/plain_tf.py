"""A plain TensorFlow program that knows nothing of malleable_tf (it never imports it): a
matmul loop that runs until a stop file appears or for --seconds, whichever comes first.

    plain_tf.py [--seconds S] [--stop FILE] [--exit N]

Prints ``THREADING {...}`` (what tf.config.threading says) once it runs, and at the end
``RESULT {...}`` (its argv, __name__, steps), then exits with code N.
"""
import argparse
import json
import os
import sys
import time

import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=5.0)
parser.add_argument("--stop", default=None)
parser.add_argument("--exit", type=int, default=0)
args = parser.parse_args()

a = tf.random.normal((256, 256))


@tf.function
def step(x):
    return tf.matmul(x, a) / 16.0


print("THREADING " + json.dumps({
    "intra": tf.config.threading.get_intra_op_parallelism_threads(),
    "inter": tf.config.threading.get_inter_op_parallelism_threads()}), flush=True)
x, steps, start = a, 0, time.monotonic()
while time.monotonic() - start < args.seconds and not (args.stop and os.path.exists(args.stop)):
    x = step(x)
    x.numpy()
    steps += 1
print("RESULT " + json.dumps({"argv": sys.argv, "name": __name__, "steps": steps,
                              "path0": sys.path[0]}), flush=True)
sys.exit(args.exit)
