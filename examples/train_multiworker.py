"""Multi-worker training on Keras 3 without Horovod: MultiWorkerMirroredStrategy under Slurm,
one worker per task, malleable on every worker.

    srun -N2 --ntasks-per-node=1 python examples/train_multiworker.py [--epochs 20]
    MALLEABLE_TF_STRATEGY=multiworker malleable-srun python examples/train_multiworker.py

A custom loop (Keras 3's ``model.fit`` does not run under this strategy, docs/FACTS.md): the
model and optimizer made in the strategy's scope, each worker its shard of a synthetic
classification set (generated from a seed: nothing is downloaded), gradients averaged across
the workers by the strategy. Each epoch every worker prints its threads and steps/s; with
``--report DIR`` it also writes its weights (``weights-<rank>-<epoch>.npy``) and a JSON line per
epoch to ``DIR/epochs-<rank>.jsonl``. ``--until FILE`` trains until FILE exists (the workers
agree on it at each epoch's end, so they stop together), ``--epochs`` at most.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import malleable_tf
import malleable_tf.multiworker as mw


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20, help="steps per epoch")
    ap.add_argument("--batch-size", type=int, default=64, help="per worker")
    ap.add_argument("--width", type=int, default=256, help="hidden width (compute per step)")
    ap.add_argument("--report", type=Path, default=None)
    ap.add_argument("--until", type=Path, default=None)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    strategy = mw.init()
    import numpy as np
    import tensorflow as tf
    import keras

    rank = malleable_tf.runtime().rank
    workers = strategy.num_replicas_in_sync
    global_batch = args.batch_size * workers
    rng = np.random.default_rng(0)              # the same data on every worker, then sharded
    n = global_batch * args.steps
    x = rng.standard_normal((n, 64)).astype("float32")
    y = (x[:, :10].argmax(axis=1)).astype("int64")

    def dataset(ctx: tf.distribute.InputContext):
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        return ds.batch(ctx.get_per_replica_batch_size(global_batch), drop_remainder=True) \
            .repeat()

    data = iter(strategy.distribute_datasets_from_function(dataset))
    with strategy.scope():
        keras.utils.set_random_seed(1)          # the same initial weights on every worker
        model = keras.Sequential([keras.layers.Input((64,)),
                                  keras.layers.Dense(args.width, activation="relu"),
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
        losses = strategy.run(replica_step, args=(batch,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    @tf.function
    def agree_to_stop(flag):     # the sum over the workers of each one's "stop" (1.0 or 0.0)
        return strategy.reduce(tf.distribute.ReduceOp.SUM,
                               strategy.run(tf.identity, args=(flag,)), axis=None)

    if args.report:
        args.report.mkdir(parents=True, exist_ok=True)
    for epoch in range(args.epochs):
        t0 = time.monotonic()
        loss = 0.0
        for _ in range(args.steps):
            loss = float(train_step(next(data)))
        seconds = time.monotonic() - t0
        state = malleable_tf.threads()
        line = {"rank": rank, "epoch": epoch, "loss": loss, "seconds": seconds,
                "steps_per_s": args.steps / seconds, "intra_active": state.intra_active,
                "allowed": len(state.allowed_cpus), "time": time.time()}
        print(f"[mw] rank {rank} epoch {epoch} loss {loss:.4f} threads {state.intra_active} "
              f"steps/s {line['steps_per_s']:.1f}", flush=True)
        if args.report:
            weights = np.concatenate([w.numpy().ravel() for w in model.trainable_variables])
            np.save(args.report / f"weights-{rank}-{epoch}.npy", weights)
            with open(args.report / f"epochs-{rank}.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")
        stop = 1.0 if args.until is not None and args.until.exists() else 0.0
        if float(agree_to_stop(tf.constant(stop))) > 0:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
