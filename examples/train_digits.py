"""A real malleable training job: Keras + Horovod on scikit-learn's handwritten digits (shipped
inside the scikit-learn package: nothing is downloaded), with MalleableCallback.

    malleable-srun python examples/train_digits.py [--epochs 30] [--checkpoint-dir DIR]

Every epoch prints the rank's cores and steps/s. On SIGTERM (time limit, preemption, scancel)
the ranks agree on a stop at the next batch, rank 0 saves a checkpoint and they exit cleanly;
a requeued job (same job id) resumes from the last checkpoint.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import malleable_tf.horovod as mh


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--width", type=int, default=512, help="hidden layer width (compute per step)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="stop (all ranks together) after this long, with a checkpoint")
    ap.add_argument("--checkpoint-dir", default=None,
                    help="default: ./checkpoints/job_<SLURM_JOB_ID>")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    mh.init()
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    from malleable_tf.keras import MalleableCallback

    ckpt_dir = Path(args.checkpoint_dir or f"checkpoints/job_{os.environ.get('SLURM_JOB_ID', 'local')}")
    state_file = ckpt_dir / "state.json"
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    x_train, y_train = x[:split][hvd.rank()::hvd.size()], y[:split][hvd.rank()::hvd.size()]
    x_val, y_val = x[split:], y[split:]
    model = tf.keras.Sequential([
        tf.keras.layers.Input((64,)),
        tf.keras.layers.Dense(args.width, activation="relu"),
        tf.keras.layers.Dense(args.width, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(1e-3 * hvd.size())),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    initial_epoch = 0
    if state_file.exists():
        state = json.loads(state_file.read_text())
        model.load_weights(str(ckpt_dir / "weights"))
        initial_epoch = int(state["epoch"])
        if hvd.rank() == 0:
            print(f"[train] resuming from the checkpoint of epoch {initial_epoch}", flush=True)
    started = time.monotonic()
    stop_requested = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.update(flag=True))

    def save(epoch: int) -> None:
        if hvd.rank() != 0:
            return
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        model.save_weights(str(ckpt_dir / "weights"))
        tmp = state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"epoch": epoch}))
        os.replace(tmp, state_file)

    class CheckpointOnSignal(tf.keras.callbacks.Callback):
        """All ranks stop at the same batch (an allreduce of the flag every 10 batches)."""

        def __init__(self):
            super().__init__()
            self.epoch = initial_epoch

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if batch % 10 == 0:
                out_of_time = args.max_seconds is not None and \
                    time.monotonic() - started > args.max_seconds
                flag = tf.constant(1.0 if stop_requested["flag"] or out_of_time else 0.0)
                if hvd_tf.allreduce(flag, op=hvd_tf.Max).numpy() > 0:
                    save(self.epoch)   # resume at the start of this epoch
                    self.model.stop_training = True
                    if hvd.rank() == 0:
                        why = "SIGTERM" if stop_requested["flag"] else "time budget"
                        print(f"[train] {why}: checkpoint saved at epoch {self.epoch}",
                              flush=True)

        def on_epoch_end(self, epoch, logs=None):
            if not self.model.stop_training:   # a signal's checkpoint resumes this epoch
                save(epoch + 1)

    history = model.fit(
        x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
        initial_epoch=initial_epoch, verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                   hvd.callbacks.MetricAverageCallback(),
                   MalleableCallback(verbose=True), CheckpointOnSignal()])
    losses = history.history.get("loss", [])
    if hvd.rank() == 0 and losses:
        _, acc = model.evaluate(x_val, y_val, verbose=0)
        print(f"[train] done: epochs {initial_epoch}..{initial_epoch + len(losses)}, "
              f"loss {losses[0] if losses else float('nan'):.4f} -> "
              f"{losses[-1] if losses else float('nan'):.4f}, validation accuracy {acc:.3f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
