"""Multi-worker training on Keras 3 without Horovod: TensorFlow's
``MultiWorkerMirroredStrategy`` under Slurm, malleable on every worker.

    import malleable_tf.multiworker as mw
    strategy = mw.init()                 # before TensorFlow runs its first op
    with strategy.scope():
        model = make_model(); optimizer = keras.optimizers.SGD(0.05)
    ...                                  # a custom loop: strategy.run(step, ...) per batch

Run one worker per Slurm task (``srun -N2 --ntasks-per-node=1 python train.py``, or
``malleable-srun``, whose runner makes the strategy (a script that names
MultiWorkerMirroredStrategy, or MALLEABLE_TF_STRATEGY=multiworker)
before the script and ``mw.init()`` returns it). Each worker's pools follow its own node's
cores, as every malleable_tf process's do; the agents size a job across its nodes as one.

Why this shape (docs/FACTS.md, TensorFlow 2.21): the strategy must be made before TensorFlow's
runtime starts ("Collective ops must be configured at program startup"), and after the pools are
sized (their size cannot change once it runs), so ``init()`` makes it inside
``malleable_tf.init()``, between the two. Keras 3's ``model.fit`` does not run under this
strategy (keras-team/keras#20585): train with a custom loop, as ``examples/train_multiworker.py``
does. The cluster is Slurm's step: its nodes (SLURM_STEP_NODELIST), tasks per node, and this
task's rank; tasks placed block-wise (Slurm's default) are worker 0, 1, ... in node order, as
TensorFlow's own SlurmClusterResolver assumes, and a worker placed otherwise is refused. A node
name that does not resolve (a mini-cluster's) is reached at its NodeAddr (``scontrol show
node``). Worker ``rank`` listens on port ``base + rank``, ``base`` from MALLEABLE_TF_WORKER_PORT
or from the job and step ids (two steps on one host rarely collide; set it when they do). A
TF_CONFIG the user set is kept as it is.
"""
from __future__ import annotations

import functools
import json
import os

from malleable_runtime.runtime import MalleableError
from malleable_runtime.slurm_step import SlurmWorkers, node_address, slurm_workers

_strategy = None                 # the strategy init() made (a second call returns it)


def tf_config(found: SlurmWorkers) -> dict:
    """TensorFlow's cluster description of the step's workers, this one's index among them."""
    return {"cluster": {"worker": [w.endpoint for w in found.workers]},
            "task": {"type": "worker", "index": found.rank}}


def init(max_threads: int | None = None, **kwargs):
    """TF_CONFIG from the Slurm step (unless set), then ``malleable_tf.init()`` making the
    ``MultiWorkerMirroredStrategy`` after the pools are sized and before TensorFlow's runtime
    starts. Returns the strategy. Other keyword arguments go to ``malleable_tf.init()``.
    A second call (the script's, after ``malleable_tf.run`` made it) returns the same strategy."""
    global _strategy
    import malleable_tf
    if _strategy is not None:
        malleable_tf.init(max_threads, **kwargs)          # joins, or says what differs
        return _strategy
    try:
        malleable_tf.runtime()
    except malleable_tf.NotInitialized:
        pass
    else:
        raise MalleableError(
            "malleable_tf.multiworker.init(): malleable_tf.init() already ran, and the strategy "
            "must be made before TensorFlow's runtime starts. Under malleable-srun or "
            "malleable_tf.run, set MALLEABLE_TF_STRATEGY=multiworker (the runner then makes it)")
    if "TF_CONFIG" in os.environ:
        config = json.loads(os.environ["TF_CONFIG"])
        rank = int(config.get("task", {}).get("index", 0))
        kwargs.setdefault("rank", rank)
    else:
        found = slurm_workers(os.environ, functools.cache(node_address))
        os.environ["TF_CONFIG"] = json.dumps(tf_config(found))
        kwargs.setdefault("rank", found.rank)
        kwargs.setdefault("local_rank", found.local_rank)
        kwargs.setdefault("local_size", found.local_size)
    made = []

    def make_strategy() -> None:
        import tensorflow as tf
        made.append(tf.distribute.MultiWorkerMirroredStrategy())

    malleable_tf.init(max_threads, before_runtime=make_strategy, **kwargs)
    _strategy = made[0]
    _later_strategies_join(_strategy)
    return _strategy


def _later_strategies_join(strategy) -> None:
    """A MultiWorkerMirroredStrategy the script makes after ours (an unmodified script under
    the runner) joins the server ours started instead of enabling collective ops again on the
    running context. Enabling them again (TensorFlow warns "Enabling collective ops after
    program startup may cause error") replaces the server's collective executor manager: a
    collective a peer already started against the old one is lost, and every worker waits
    forever (seen when the chief made its own strategy 3 s after its peer began training;
    tests/integration/test_malleable_tf.py, test_a_late_chief_joins_the_strategy_the_runner_made). TensorFlow reads both flags with getattr on the
    instance, so class values set here are what a later instance sees: its server started, and
    the health check as ours has it (off where the coordination service watches the peers)."""
    extended = type(strategy.extended)
    extended._std_server_started = True
    extended._enable_check_health = strategy.extended._enable_check_health

