"""Keras 3 across nodes as TensorFlow's own tutorials write it: MultiWorkerMirroredStrategy, a
custom loop, nothing of this project imported. Made malleable from outside:

    malleable-srun python examples/train_multiworker_unmodified.py
    srun python -m malleable_tf.run examples/train_multiworker_unmodified.py

The runner reads the script (without running it), sees that it names
MultiWorkerMirroredStrategy, and makes the strategy from the Slurm step before the script runs
(it must exist before TensorFlow's runtime starts; TF_CONFIG is set from the step). The script's
own ``MultiWorkerMirroredStrategy()`` then joins the same cluster. Each epoch every worker prints
its steps/s; with ``--report DIR`` it writes a JSON line per epoch to ``DIR/epochs-<rank>.jsonl``
with a digest of its weights (equal on every worker). ``--until FILE`` trains until FILE exists
(the workers agree at each epoch's end), ``--epochs`` at most.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import tensorflow as tf
import keras


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64, help="per worker")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--report", type=Path, default=None)
    ap.add_argument("--until", type=Path, default=None)
    args = ap.parse_args(argv)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = strategy.cluster_resolver.task_id
    global_batch = args.batch_size * strategy.num_replicas_in_sync
    rng = np.random.default_rng(0)
    x = rng.standard_normal((global_batch * args.steps, 64)).astype("float32")
    y = x[:, :10].argmax(axis=1).astype("int64")

    def dataset(ctx):
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        return ds.batch(ctx.get_per_replica_batch_size(global_batch), drop_remainder=True) \
            .repeat()

    data = iter(strategy.distribute_datasets_from_function(dataset))
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.layers.Input((64,)),
                                  keras.layers.Dense(args.width, activation="relu"),
                                  keras.layers.Dense(10)])
        optimizer = keras.optimizers.SGD(0.05)
    loss_of = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def replica_step(batch):
        features, labels = batch
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_of(labels, model(features, training=True)),
                                              global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(batch):
        return strategy.reduce(tf.distribute.ReduceOp.SUM,
                               strategy.run(replica_step, args=(batch,)), axis=None)

    @tf.function
    def agree_to_stop(flag):
        return strategy.reduce(tf.distribute.ReduceOp.SUM,
                               strategy.run(tf.identity, args=(flag,)), axis=None)

    if args.report:
        args.report.mkdir(parents=True, exist_ok=True)
    for epoch in range(args.epochs):
        t0 = time.monotonic()
        for _ in range(args.steps):
            loss = float(train_step(next(data)))
        seconds = time.monotonic() - t0
        digest = hashlib.sha256(b"".join(w.numpy().tobytes()
                                         for w in model.trainable_variables)).hexdigest()
        line = {"rank": rank, "epoch": epoch, "loss": loss,
                "steps_per_s": round(args.steps / seconds, 2), "weights_sha256": digest}
        print(json.dumps(line), flush=True)
        if args.report:
            with open(args.report / f"epochs-{rank}.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")
        stop = 1.0 if args.until is not None and args.until.exists() else 0.0
        if float(agree_to_stop(tf.constant(stop))) > 0:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
