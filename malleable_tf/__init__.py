"""malleable_tf: resize TensorFlow's intra-op and inter-op thread pools in a running process.

    import malleable_tf
    malleable_tf.init()                  # before TensorFlow runs its first op
    malleable_tf.set_threads(intra=1)    # from anywhere, at any time
    malleable_tf.threads()               # ThreadState(intra_active=1, intra_pool=..., ...)

The pools are created at their largest size (``max_threads``, default: the CPUs this process
may use) and idle threads are "parked" to run with fewer. By default the active threads follow
the process's CPU allowance (affinity mask, cpuset cgroup, CPU quota), split among the ranks
that share the node, and a control signal (SIGRTMIN+3 by default: SIGUSR1 is the job script's
own, ``sbatch --signal=B:USR1@60`` being the common checkpoint idiom) makes the runtime look at
once.

Environment (read once, into ``malleable_tf.settings.Settings``): MALLEABLE_TF_STATUS (status
record path; may hold {rank}, {local_rank}, {pid}, {job}, {node}, {step}), MALLEABLE_TF_TARGET
(the co-scheduler's ``malleable_protocol.Target``, the cores the job holds on this node, re-read
on a reload signal and once a second; the same placeholders), MALLEABLE_TF_SIGNALS
("RTMIN+3=reload,USR2=intra-down"; USR1, USR2, RTMIN+n, RTMAX-n), MALLEABLE_TF_MAX_THREADS (a
number or "node"), MALLEABLE_TF_FOLLOW=0 to stop following the allowance, MALLEABLE_TF_SPLIT
(active: kernels split work as many ways as there are active intra-op threads, the default;
eigen: only Eigen kernels do; pool: kernels split by the pool size), MALLEABLE_TF_ALLOWANCE=cgroup
to take the cpuset cgroup alone as the allowance (what malleable-srun sets: Slurm binds each task's
mask at launch, and that mask does not widen when the co-scheduler grows the cpuset),
MALLEABLE_TF_COUNT_STEPS=0 to stop counting each Keras optimizer's apply_gradients as a step,
MALLEABLE_TF_PIN=allowance to pin the threads to the whole allowance instead of the rank's share
of it (the same thread counts; ranks then float over their node's cores).
Inside a Slurm job on a node whose co-scheduler made the job's folder, what malleable-srun would
set is assumed where unset (``python train.py`` in a batch script joins the co-scheduler too).

The framework-neutral part (following the allowance, control signals and the target, status
records, step counting) is ``malleable_runtime``; this package is TensorFlow's adapter to it
(``malleable_tf.pools``: parking through the native library) and TensorFlow's own helpers
(keras, data, horovod, multiworker, run).

Steps/s per thread count (the status record) come from the optimizers' apply_gradients, from
``malleable_tf.step()`` in loops the runtime cannot see, or from ``MalleableCallback``.
"""
from __future__ import annotations

import atexit
import os
import threading
from typing import Callable

from malleable_runtime.control import Action
from malleable_runtime.runtime import MalleableError, NotInitialized, Runtime
from malleable_runtime import session
from malleable_runtime.session import (ignore_signals_until_init, place, settings_from_env,
                                       setup_logging, start_runtime)
from malleable_runtime.state import ThreadState
from .settings import OneDnn, Settings
from ._native import NativeBuildError
from .pools import NativeWakeups, TfPools

# The API, and its one front door: users import these from ``malleable_tf``, never from the
# modules that define them (tests/unit/test_package_edges.py checks every importer).
__all__ = ["init", "set_threads", "threads", "step", "shutdown", "runtime", "ThreadState", "Action",
           "MalleableError", "NotInitialized", "NativeBuildError"]

_init_lock = threading.Lock()
# What the running init() settled on, and whether a later init() may join it: malleable_tf.run
# sets _joinable, so that a script run through it may still call init() itself (see _join).
_settings: dict | None = None
_joinable = False


ignore_signals_until_init(os.environ)


def init(max_threads: int | None = None, *, inter_max_threads: int | None = None,
         follow: bool | None = None, signals: dict[int, Action] | None = None,
         poll_interval_s: float = 0.005, recheck_interval_s: float = 1.0, status_path: str | os.PathLike | None = None,
         local_rank: int | None = None, local_size: int | None = None,
         rank: int | None = None, count_steps: bool | None = None,
         before_runtime: Callable[[], None] | None = None) -> ThreadState:
    """Size TensorFlow's pools at ``max_threads`` and start managing them.

    Must run before TensorFlow executes its first op. ``local_rank``/``local_size`` default to
    what the launcher (mpirun, srun, horovodrun) put in the environment. When following, a
    native poll compares the affinity mask and the cgroup files every ``poll_interval_s``; the
    whole allowance is also re-read every ``recheck_interval_s``. ``count_steps`` (default:
    on, unless MALLEABLE_TF_COUNT_STEPS=0) counts each Keras optimizer's ``apply_gradients`` as a
    training step, also inside a ``tf.function``.

    ``before_runtime`` runs once the pools are sized and before TensorFlow's runtime starts:
    what must be made then (``malleable_tf.multiworker`` makes its strategy there).

    Under ``python -m malleable_tf.run`` the runner has already called it: a call here then
    returns the running state, and raises MalleableError only if it asks for other settings.
    """
    global _settings
    asked = dict(locals())   # the arguments alone, for a second call's check
    with _init_lock:
        if session.running() is not None:
            if not _joinable:
                raise MalleableError("malleable_tf.init() already ran")
            return _join(asked)
        # Every setting is checked before TensorFlow is touched: a bad one leaves init() free
        # to run again.
        env = settings_from_env(Settings.from_env)
        for name, value in (("max_threads", max_threads), ("inter_max_threads",
                                                          inter_max_threads)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 1 <= value <= 4096):
                raise ValueError(f"{name} must be an int in 1..4096, not {value!r}")
        follow = env.follow if follow is None else follow
        count_steps = env.count_steps if count_steps is None else count_steps
        signals = dict(env.signals) if signals is None else signals

        import tensorflow as tf

        from ._native import load

        # The default size is the CPUs usable once TensorFlow is imported (seconds after
        # start): a container the co-scheduler starts on one core and grows at once gets a
        # pool of the grown size (read before the import, it had one thread for good).
        max_threads = max_threads or env.max_threads or len(os.sched_getaffinity(0))
        inter_max = inter_max_threads or max_threads

        try:
            tf.config.threading.set_intra_op_parallelism_threads(max_threads)
            tf.config.threading.set_inter_op_parallelism_threads(inter_max)
        except RuntimeError as exc:
            raise MalleableError("malleable_tf.init() must run before TensorFlow executes its "
                                 f"first op ({exc})") from exc
        if before_runtime is not None:
            before_runtime()
        setup_logging(env.log, "malleable_tf")   # before load(): it may warn (parking only)
        native = load(tf, env.native)
        intra_pool = native.attach(inter_max)
        if intra_pool != max_threads:
            raise MalleableError(f"TensorFlow made an intra-op pool of {intra_pool} threads, "
                                 f"not {max_threads}")
        pools = TfPools(native, intra_pool=intra_pool, inter_pool=inter_max, split=env.split,
                        onednn_inline=env.onednn is OneDnn.INLINE)
        where = place(env, status_path=status_path, local_rank=local_rank,
                      local_size=local_size, rank=rank)

        def count_optimizer_steps(rt: Runtime) -> None:
            from .keras import count_optimizer_steps
            count_optimizer_steps(rt)

        rt = start_runtime(pools, NativeWakeups(native), env, where, follow=follow,
                           signals=signals, poll_interval_s=poll_interval_s,
                           recheck_interval_s=recheck_interval_s,
                           before_watcher=count_optimizer_steps if count_steps else None)
        _settings = {**asked, "max_threads": max_threads, "inter_max_threads": inter_max,
                     "follow": follow, "signals": dict(signals),
                     "status_path": where.status_path, "local_rank": where.local_rank,
                     "local_size": where.local_size, "rank": where.rank,
                     "count_steps": count_steps, "_fields": dict(where.fields)}
        session.set_running(rt)
        atexit.register(shutdown)
        return rt.state()


def _join(asked: dict) -> ThreadState:
    """init() again, the runtime running (started by malleable_tf.run)."""
    session.check_join(init, asked, _settings or {}, package="malleable_tf",
                       env_names="MALLEABLE_TF_MAX_THREADS, MALLEABLE_TF_SIGNALS, "
                                 "MALLEABLE_TF_STATUS, MALLEABLE_TF_FOLLOW")
    return runtime().state()


def runtime() -> Runtime:
    rt = session.running()
    if rt is None:
        raise NotInitialized()
    return rt


def set_threads(intra: int | None = None, inter: int | None = None) -> ThreadState:
    """Set the active intra-op and/or inter-op threads (1..pool size). When following the
    allowance, the active count is also capped by this rank's share of the allowed cores."""
    return runtime().set_threads(intra, inter)


def threads() -> ThreadState:
    return runtime().state()


def step(n: int = 1) -> None:
    """Count ``n`` training steps done just now, for loops the runtime cannot see (no Keras
    optimizer, or ``init(count_steps=False)``). Cheap and thread-safe; before ``init()`` and
    after ``shutdown()`` it does nothing, so a script runs the same without malleable_tf."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"step(n): n must be an int >= 0, not {n!r}")
    rt = session.running()
    if rt is not None:
        rt.step(n)


def shutdown() -> None:
    """Unpark every thread for good (so the process can exit) and stop the watcher."""
    with _init_lock:
        rt = session.running()
        session.set_running(None)
    if rt is not None:
        rt.close()
