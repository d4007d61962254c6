"""The input pipeline follows the thread count: gated tf.data map functions.

tf.data runs map functions on threads of its own, outside the intra-op and inter-op pools, so
parking does not limit them (pinning keeps them on this rank's cores, nothing more). A gated
map function takes a ticket before it reads its element and returns it once its outputs are
computed; at most as many calls as there are active inter-op threads hold a ticket at once, and
that number changes with every resize. The other calls wait in a queue, holding no thread and
using no CPU; deleting the iterator cancels them.

    import malleable_tf, malleable_tf.data
    malleable_tf.init()
    ds = malleable_tf.data.map(ds, parse, num_parallel_calls=tf.data.AUTOTUNE)
    # or: ds.map(malleable_tf.data.gate(parse), num_parallel_calls=...)
    #     .with_options(malleable_tf.data.options())

TensorFlow sizes a pipeline's thread pool, and so AUTOTUNE's most calls at once, by the cores
the process may use when its iterator is made: a pipeline started on one core stays at one call
after cores are added. ``options()`` gives the pipeline a private pool as large as the inter-op
pool, so it can widen; ``map`` applies it (options set on any stage apply to the whole pipeline).

``options()`` also turns tf.data's autotuning off: the gate, not the autotuner, decides how many
calls run, and AUTOTUNE parallelism is fixed at TensorFlow's default (the pool's size, at most
16). The autotuner's thread can miss its own cancellation (TensorFlow 2.15's CancellationManager
runs the callback that wakes it before it marks itself cancelled); the iterator's teardown then
waits out the autotuner's current period, which doubles up to 60 s. Malleable jobs outlived their
last step by 6-20 s that way, holding their cores. ``options(autotune=True)`` keeps it.

Work inside ``fn`` that does not depend on the element may start before the ticket is taken.
Do not nest gated functions (a gated function that iterates another gated pipeline): the outer
calls could hold every ticket the inner ones wait for.
"""
from __future__ import annotations

import functools
from typing import Callable

import malleable_tf


def gate(fn: Callable) -> Callable:
    """Wrap a tf.data map function so that its calls pass the gate. Needs ``init()`` first."""
    ops = malleable_tf.runtime().pools.ops

    @functools.wraps(fn)
    def gated(*args):
        import tensorflow as tf
        ticket = ops.malleable_gate_acquire()
        with tf.control_dependencies([ticket]):
            args = tf.nest.map_structure(tf.identity, args)
        out = fn(*args)
        leaves = [t for t in tf.nest.flatten(out, expand_composites=True) if tf.is_tensor(t)]
        with tf.control_dependencies(leaves):
            released = ops.malleable_gate_release(ticket)
        with tf.control_dependencies([released]):
            return tf.nest.map_structure(
                lambda t: tf.identity(t) if tf.is_tensor(t) else t, out)

    return gated


def options(autotune: bool = False):
    """``tf.data.Options`` with a private thread pool of the inter-op pool's size (the most
    threads this process can grow to) and, unless ``autotune``, no autotuner (see above); the
    gate decides how many map calls run at once."""
    import tensorflow as tf
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = malleable_tf.runtime().inter_pool
    opts.autotune.enabled = autotune
    return opts


def map(dataset, fn: Callable, num_parallel_calls=None, deterministic=None, name=None):  # noqa: A001
    """``dataset.map(gate(fn), ...).with_options(options())``."""
    return dataset.map(gate(fn), num_parallel_calls=num_parallel_calls,
                       deterministic=deterministic, name=name).with_options(options())


def stats() -> dict[str, int]:
    """The gate now: capacity, calls holding a ticket, the most at once since the last
    ``reset_max()``, tickets ever taken, calls waiting (queued: they hold no thread)."""
    lib = malleable_tf.runtime().pools.lib
    return {"capacity": lib.mtf_gate_stat(0), "in_use": lib.mtf_gate_stat(1),
            "max_in_use": lib.mtf_gate_stat(2), "acquired": lib.mtf_gate_stat(3),
            "waiting": lib.mtf_gate_stat(4)}


def reset_max() -> None:
    malleable_tf.runtime().pools.lib.mtf_gate_reset_max()
