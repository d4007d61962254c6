"""A MultiWorkerMirroredStrategy worker that knows nothing of malleable_tf, whose chief (worker 0,
the collective group's leader) makes its strategy ``--late`` seconds after starting, while its
peer is already in its first collective: what a chief slower to import or to read its data does.

    TF_CONFIG=... multiworker_late_chief.py [--late S] [--steps N]

Sums each worker's rank + 1 over the workers ``--steps`` times and prints ``RESULT {...}``
(its rank, the last sum).
"""
import argparse
import json
import os
import time

import tensorflow as tf

ap = argparse.ArgumentParser()
ap.add_argument("--late", type=float, default=3.0)
ap.add_argument("--steps", type=int, default=5)
args = ap.parse_args()
rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
if rank == 0:
    time.sleep(args.late)
strategy = tf.distribute.MultiWorkerMirroredStrategy()


@tf.function
def total(x):
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(x,)),
                           axis=None)


for _ in range(args.steps):
    result = float(total(tf.constant(float(rank + 1))))
print("RESULT " + json.dumps({"rank": rank, "sum": result}), flush=True)
