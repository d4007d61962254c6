"""Keras integration: ``MalleableCallback`` measures steps/s per thread count and reports them.

Resizes take effect in native code at any moment (the runtime's watcher applies them); the
callback adds what belongs at batch boundaries: steps/s bookkeeping per thread count for the
co-scheduler, the status record, and one progress line per epoch.
"""
from __future__ import annotations

import sys
import time

import tensorflow as tf

from .runtime import Runtime


class MalleableCallback(tf.keras.callbacks.Callback):
    def __init__(self, runtime: Runtime | None = None, *, report_every_s: float = 2.0,
                 verbose: bool = True, stream=None, clock=time.monotonic):
        super().__init__()
        self._runtime = runtime
        self.report_every_s = report_every_s
        self.verbose = verbose
        self.stream = stream or sys.stdout
        self._clock = clock
        self._window_start = None
        self._window_steps = 0
        self._window_threads = None
        self._epoch_start = None
        self._epoch_steps = 0
        self.history: list[dict] = []   # one entry per epoch

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            from . import runtime
            self._runtime = runtime()
        return self._runtime

    def _flush(self, now: float) -> None:
        if self._window_start is not None and self._window_steps:
            self.runtime.record_steps(self._window_steps, now - self._window_start,
                                      threads=self._window_threads)
            self.runtime.write_status()
        self._window_start = now
        self._window_steps = 0
        self._window_threads = self.runtime.state().intra_active

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._clock()
        self._epoch_steps = 0
        self._flush(self._epoch_start)

    def on_train_batch_begin(self, batch, logs=None):
        # The watcher applies resizes as they come; here only the bookkeeping follows them.
        if self.runtime.state().intra_active != self._window_threads:
            self._flush(self._clock())   # steps/s is attributed to one thread count only

    def on_train_batch_end(self, batch, logs=None):
        self._window_steps += 1
        self._epoch_steps += 1
        now = self._clock()
        if now - self._window_start >= self.report_every_s:
            self._flush(now)

    def on_epoch_end(self, epoch, logs=None):
        now = self._clock()
        self._flush(now)
        state = self.runtime.state()
        secs = now - self._epoch_start
        entry = {"epoch": epoch, "steps": self._epoch_steps, "seconds": round(secs, 3),
                 "steps_per_s": round(self._epoch_steps / secs, 3) if secs > 0 else 0.0,
                 "intra": state.intra_active, "inter": state.inter_active,
                 "cores": len(state.share_cpus), "loss": (logs or {}).get("loss")}
        self.history.append(entry)
        if self.verbose:
            loss = f" loss {entry['loss']:.4f}" if entry["loss"] is not None else ""
            print(f"[malleable] rank {self.runtime.rank} epoch {epoch + 1}: "
                  f"{entry['steps_per_s']:.1f} steps/s, cores {entry['cores']}, "
                  f"intra {state.intra_active}/{state.intra_pool}, "
                  f"inter {state.inter_active}/{state.inter_pool}{loss}",
                  file=self.stream, flush=True)
