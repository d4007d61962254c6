"""Run an unmodified training script malleably.

    python -m malleable_tf.run SCRIPT [ARGS...]
    python -m malleable_tf.run -m MODULE [ARGS...]

calls ``malleable_tf.init()`` with the rank, local rank and local size that the launcher (srun,
mpirun, horovodrun) put in the environment, before the script runs, then runs SCRIPT as
``__main__`` the way ``python SCRIPT ARGS`` would: ``sys.argv`` is ``[SCRIPT, *ARGS]``,
``sys.path[0]`` is the script's folder, and its exit code is the process's (``sys.exit`` passes
through; an uncaught exception exits 1 with its traceback). A script that names
``MultiWorkerMirroredStrategy`` gets the strategy made first, from the Slurm step
(``malleable_tf.multiworker``: it must exist before TensorFlow's runtime starts), unless
MALLEABLE_TF_STRATEGY says otherwise. The settings come from the environment:
MALLEABLE_TF_MAX_THREADS, MALLEABLE_TF_STATUS, MALLEABLE_TF_SIGNALS, ... (see
``malleable_tf.settings``). A script that calls ``malleable_tf.init()`` or
``malleable_tf.horovod.init()`` itself still works: that call returns the running state
(``horovod.init`` still runs ``hvd.init()``), and raises MalleableError only if it asks for other
settings.

``malleable-srun python SCRIPT`` runs every rank through this module; the command line and
how the script runs are ``malleable_runtime.runner``'s.
"""
from __future__ import annotations

import os
import sys

from malleable_runtime import runner

from .settings import Settings, Strategy


# What makes a script a multi-worker one: the strategy must exist before TensorFlow's runtime
# starts, so the runner makes it (MALLEABLE_TF_STRATEGY=auto, the default).
MULTIWORKER_NAMES = frozenset({"MultiWorkerMirroredStrategy"})


def strategy_for(program: runner.Program | None, given: Strategy) -> Strategy:
    """The strategy to make before the script: MALLEABLE_TF_STRATEGY's when set, else
    multiworker for a script that names MultiWorkerMirroredStrategy (read, not run)."""
    if given is not Strategy.AUTO:
        return given
    facts = runner.source_facts(program.path) if program and program.path else None
    return Strategy.MULTIWORKER if facts and facts.names & MULTIWORKER_NAMES else Strategy.NONE


def init_from_launcher(program: runner.Program | None = None) -> object:
    """``malleable_tf.init()`` with the ranks the launcher gave this process (and the
    multi-worker strategy where the script uses it); a script's own init() may then join it."""
    import malleable_tf

    launched = Settings.from_env(os.environ)
    if strategy_for(program, launched.strategy) is Strategy.MULTIWORKER:
        from malleable_tf import multiworker
        multiworker.init()
        state = malleable_tf.threads()
    else:
        state = malleable_tf.init(local_rank=launched.local_rank,
                                  local_size=launched.local_size, rank=launched.rank)
    malleable_tf._joinable = True
    return state


def main(argv: list[str] | None = None) -> int:
    # A lambda: tests replace init_from_launcher on this module.
    return runner.main(argv, prog="malleable_tf.run",
                       start=lambda program: init_from_launcher(program),
                       start_name="malleable_tf.init()", doc=__doc__ or "")


if __name__ == "__main__":
    sys.exit(main())
