"""Horovod helpers: each rank takes its share of the node from its local rank and local size.

Horovod (0.28.1, its last release) works with Keras 2 only: with Keras 3 (``tf.keras`` on
TensorFlow 2.16 and later) ``hvd.DistributedOptimizer`` + ``model.fit`` trains every rank on its
own gradients, without an error (docs/FACTS.md). ``init()`` therefore refuses Keras 3 before
Horovod starts. There is no switch to override it: no use of Horovod with Keras 3 was seen to
train right. (A custom loop that averages with ``hvd.DistributedGradientTape`` does not go
through the optimizer, but it was never run on Keras 3 here either: Horovod 0.28.1 does not
build against TensorFlow 2.21 unpatched.)
"""
from __future__ import annotations

import sys

from . import init as _init
from malleable_runtime.runtime import MalleableError
from malleable_runtime.state import ThreadState


class KerasVersionError(MalleableError):
    """Horovod was asked for in a process whose Keras is Keras 3."""


def keras_version() -> tuple[str, str] | None:
    """The Keras that ``tf.keras`` is in this process, the one Horovod's Keras integration wraps:
    (its package, its version), e.g. ("keras", "2.15.0") on TensorFlow 2.15, ("keras", "3.15.1")
    on 2.21, ("tf_keras", "2.17.0") with TF_USE_LEGACY_KERAS=1. When ``tf.keras`` cannot load
    (TF_USE_LEGACY_KERAS=1 without tf_keras), the ``keras`` package a script would use instead;
    None without any Keras.

    Imports TensorFlow (``horovod.tensorflow`` and ``malleable_tf.init()`` import it next anyway)
    and resolves ``tf.keras``, which runs no TensorFlow op: the pools can still be sized."""
    import tensorflow as tf

    try:
        module = tf.keras.optimizers.Optimizer.__module__
    except Exception:  # noqa: BLE001 - ImportError; RecursionError on a failed loader's next touch
        module = None
    if module is not None:
        package = module.partition(".")[0]
        version = getattr(sys.modules[package], "__version__", None)
        if version is None:
            from importlib.metadata import version as installed
            version = installed(package)
        return package, str(version)
    try:
        import keras
    except ImportError:
        return None
    return "keras", str(keras.__version__)


def refuse_keras3() -> None:
    """Raise ``KerasVersionError`` when this process's Keras is Keras 3 (see the module's doc)."""
    found = keras_version()
    if found is None:
        return
    package, version = found
    major = version.split(".")[0]
    if not major.isdigit() or int(major) < 3:
        return
    import tensorflow as tf
    raise KerasVersionError(
        f"malleable_tf.horovod.init(): this process's Keras is Keras 3 ({package} {version}, "
        f"TensorFlow {tf.__version__}), and Horovod does not average gradients with Keras 3: "
        "hvd.DistributedOptimizer with model.fit trains every rank on its own gradients, "
        "silently (docs/FACTS.md). Stopping instead of training wrong. Use TensorFlow 2.15 with "
        "Keras 2 (tensorflow-cpu==2.15.1, horovod==0.28.1), or Keras 2 through tf_keras "
        "(pip install tf_keras; TF_USE_LEGACY_KERAS=1) where Horovod builds against that "
        "TensorFlow, or train on Keras 3 without Horovod: tf.distribute.MultiWorkerMirroredStrategy.")


def init(max_threads: int | None = None, **kwargs) -> ThreadState:
    """``hvd.init()`` then ``malleable_tf.init()`` with Horovod's rank, local rank and local size.

    Call it before TensorFlow runs its first op, in place of both inits. Works the same under
    ``srun --mpi=pmix``, ``mpirun`` and ``horovodrun``. Raises ``KerasVersionError`` (a
    ``MalleableError``) before Horovod starts when ``tf.keras`` is Keras 3 (see the module's doc).
    """
    refuse_keras3()
    import horovod.tensorflow as hvd

    hvd.init()
    return _init(max_threads, local_rank=hvd.local_rank(), local_size=hvd.local_size(),
                 rank=hvd.rank(), **kwargs)
