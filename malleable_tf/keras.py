"""Keras integration: steps counted from every Keras optimizer, and ``MalleableCallback``.

``count_optimizer_steps`` (run by ``malleable_tf.init()`` unless ``count_steps=False``) makes
each ``apply_gradients`` of a Keras optimizer (and, in Keras 3, each ``apply``, which custom
loops may call directly) count one step, in custom loops as in ``Model.fit``. Inside a ``tf.function`` the Python of a call runs only while tracing, so the count
is an op in the graph: an int64 variable's ``assign_add``, which the runtime reads from Python.

Resizes take effect in native code at any moment (the runtime's watcher applies them) and the
runtime credits steps to the thread count in force; the callback adds what belongs at batch
boundaries: the count when nothing else counts, and one progress line per epoch.
"""
from __future__ import annotations

import functools
import logging
import sys
import threading
import time

import tensorflow as tf

from malleable_runtime.runtime import NotInitialized, Runtime
from malleable_runtime.session import running

log = logging.getLogger(__name__)

_step_var: tf.Variable | None = None   # one per process: the classes are patched once
_inside = threading.local()            # an apply_gradients under way in this thread


# What a training step calls on its optimizer: Keras 2 and 3 have apply_gradients; Keras 3's
# apply_gradients calls apply, which custom loops may also call directly (counted once: _inside).
_STEP_METHODS = ("apply_gradients", "apply")


def _optimizer_classes() -> list[type]:
    """The optimizer base classes: Keras 2 (TF 2.15) has the current one and the legacy one,
    Keras 3 (TF 2.16 and later) the one."""
    out = []
    for name in ("Optimizer", "legacy.Optimizer"):
        obj = tf.keras.optimizers
        try:
            for part in name.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        if isinstance(obj, type) and hasattr(obj, "apply_gradients") and obj not in out:
            out.append(obj)
    return out


def _count_one(var: tf.Variable) -> None:
    ctx = tf.distribute.get_replica_context()
    if ctx is not None and ctx.num_replicas_in_sync > 1:
        # Each replica calls apply_gradients: the merge runs once per step (per process).
        ctx.merge_call(lambda _: var.assign_add(1, read_value=False))
    else:
        var.assign_add(1, read_value=False)


def _counting(apply):
    @functools.wraps(apply)
    @tf.autograph.experimental.do_not_convert   # like Keras itself: autograph leaves it be
    def counted(self, *args, **kwargs):
        if getattr(_inside, "active", False):
            # A wrapper's inner optimizer, or super() of a subclass (Horovod): one step.
            return apply(self, *args, **kwargs)
        _inside.active = True
        try:
            result = apply(self, *args, **kwargs)
        finally:
            _inside.active = False
        _count_one(_step_var)   # after: a call that raised applied nothing
        return result

    counted._malleable_counting = True
    return counted


def count_optimizer_steps(runtime: Runtime) -> bool:
    """Count one step of ``runtime`` per ``apply_gradients`` of any Keras optimizer. False (and
    a warning) when this Keras has no optimizer class to hook."""
    global _step_var
    classes = _optimizer_classes()
    if not classes:
        log.warning("malleable_tf: no Keras optimizer class found; steps are counted only by "
                    "malleable_tf.step() and MalleableCallback")
        return False
    if _step_var is None:
        with tf.init_scope():
            _step_var = tf.Variable(0, dtype=tf.int64, trainable=False,
                                    name="malleable_tf_steps")
        for cls in classes:
            for name in _STEP_METHODS:
                method = getattr(cls, name, None)
                if method is not None and not getattr(method, "_malleable_counting", False):
                    setattr(cls, name, _counting(method))
    var = _step_var
    start = int(var.numpy())   # a runtime counts from its own start
    runtime.add_step_source(lambda: int(var.numpy()) - start)
    runtime.counts_optimizer_steps = True
    return True


class MalleableCallback(tf.keras.callbacks.Callback):
    """Prints a progress line per epoch (and keeps it in ``history``); counts a step per batch
    when the runtime does not count optimizer steps itself (``init(count_steps=False)``).
    ``report_every_s`` is kept for existing callers: the runtime's sampler sets the windows."""

    def __init__(self, runtime: Runtime | None = None, *, report_every_s: float = 2.0,
                 verbose: bool = True, stream=None, clock=time.monotonic):
        super().__init__()
        self._runtime = runtime
        self.report_every_s = report_every_s
        self.verbose = verbose
        self.stream = stream or sys.stdout
        self._clock = clock
        self._count = False
        self._epoch_start = None
        self._epoch_steps = 0
        self.history: list[dict] = []   # one entry per epoch

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            rt = running()
            if rt is None:
                raise NotInitialized()
            self._runtime = rt
        return self._runtime

    def on_train_begin(self, logs=None):
        # apply_gradients counts each step already when the runtime hooks the optimizers.
        self._count = not self.runtime.counts_optimizer_steps

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._clock()
        self._epoch_steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self._epoch_steps += 1
        if self._count:
            self.runtime.step()

    def on_epoch_end(self, epoch, logs=None):
        now = self._clock()
        self.runtime.sample_steps(flush=True)   # the epoch's steps reach the status record
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
