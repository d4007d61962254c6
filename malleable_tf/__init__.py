"""malleable_tf: resize TensorFlow's intra-op and inter-op thread pools in a running process.

    import malleable_tf
    malleable_tf.init()                  # before TensorFlow runs its first op
    malleable_tf.set_threads(intra=1)    # from anywhere, at any time
    malleable_tf.threads()               # ThreadState(intra_active=1, intra_pool=..., ...)

The pools are created at their largest size (``max_threads``, default: the CPUs this process
may use) and idle threads are "parked" to run with fewer. By default the active threads follow
the process's CPU allowance (affinity mask, cpuset cgroup, CPU quota), split among the ranks
that share the node, and a control signal (SIGUSR1 by default) makes the runtime look at once.

Environment: MALLEABLE_TF_STATUS (status record path; may hold {rank}, {local_rank}, {pid},
{job}, {node}), MALLEABLE_TF_TARGET (the co-scheduler's ``malleable_protocol.Target``, the cores the
job holds on this node, re-read on a reload signal and once a second; the same placeholders),
MALLEABLE_TF_SIGNALS ("USR1=reload,USR2=intra-down"), MALLEABLE_TF_MAX_THREADS (a number or "node"),
MALLEABLE_TF_FOLLOW=0 to stop following the allowance, MALLEABLE_TF_SPLIT (active: kernels
split work as many ways as there are active intra-op threads, the default; eigen: only Eigen
kernels do; pool: kernels split by the pool size), MALLEABLE_TF_ALLOWANCE=cgroup to take
the cpuset cgroup alone as the allowance (what malleable-srun sets: Slurm binds each task's
mask at launch, and that mask does not widen when the co-scheduler grows the cpuset).
"""
from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from . import allowance
from .runtime import (DEFAULT_SIGNALS, Action, MalleableError, NotInitialized, Runtime, Split,
                      ThreadState, parse_signal_spec)
from ._native import NativeBuildError

__all__ = ["init", "set_threads", "threads", "shutdown", "runtime", "ThreadState", "Action",
           "MalleableError", "NotInitialized", "NativeBuildError"]

_runtime: Runtime | None = None
_init_lock = threading.Lock()


def _configured_signals() -> dict[int, Action]:
    spec = os.environ.get("MALLEABLE_TF_SIGNALS")
    return parse_signal_spec(spec) if spec else dict(DEFAULT_SIGNALS)


def _ignore_until_init() -> None:
    """A control signal that arrives before init() must not kill the process (the default action
    of SIGUSR1): ignore the configured signals until init() installs the real handler."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        for signo in _configured_signals():
            if signal.getsignal(signo) == signal.SIG_DFL:
                signal.signal(signo, signal.SIG_IGN)
    except ValueError:
        pass  # a bad MALLEABLE_TF_SIGNALS is reported by init()


_ignore_until_init()


def _env_max_threads() -> int | None:
    """MALLEABLE_TF_MAX_THREADS: a number, or "node" for every core of this node (what
    malleable-srun sets: the pool must be able to grow past the cores held at launch)."""
    value = os.environ.get("MALLEABLE_TF_MAX_THREADS")
    if not value:
        return None
    if value == "node":
        return os.cpu_count() or 1
    if not value.isdigit():
        raise ValueError(f"MALLEABLE_TF_MAX_THREADS must be a number or 'node', not {value!r}")
    return int(value)


def init(max_threads: int | None = None, *, inter_max_threads: int | None = None,
         follow: bool | None = None, signals: dict[int, Action] | None = None,
         poll_interval_s: float = 0.005, recheck_interval_s: float = 1.0, status_path: str | os.PathLike | None = None,
         local_rank: int | None = None, local_size: int | None = None,
         rank: int | None = None) -> ThreadState:
    """Size TensorFlow's pools at ``max_threads`` and start managing them.

    Must run before TensorFlow executes its first op. ``local_rank``/``local_size`` default to
    what the launcher (mpirun, srun, horovodrun) put in the environment. When following, a
    native poll compares the affinity mask and the cgroup files every ``poll_interval_s``; the
    whole allowance is also re-read every ``recheck_interval_s``.
    """
    global _runtime
    with _init_lock:
        if _runtime is not None:
            raise MalleableError("malleable_tf.init() already ran")
        import tensorflow as tf

        from ._native import load

        max_threads = max_threads or _env_max_threads() or len(os.sched_getaffinity(0))
        inter_max = inter_max_threads or max_threads
        for name, value in (("max_threads", max_threads), ("inter_max_threads", inter_max)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
                raise ValueError(f"{name} must be an int in 1..4096, not {value!r}")
        if follow is None:
            follow = os.environ.get("MALLEABLE_TF_FOLLOW", "1") != "0"
        signals = _configured_signals() if signals is None else signals
        # Every setting is checked before TensorFlow is touched: a bad one leaves init() free
        # to run again.
        source = os.environ.get("MALLEABLE_TF_ALLOWANCE", "auto")
        if source not in ("auto", "cgroup"):
            raise ValueError(f"MALLEABLE_TF_ALLOWANCE must be auto or cgroup, not {source!r}")
        try:
            split = Split(os.environ.get("MALLEABLE_TF_SPLIT", "active"))
        except ValueError:
            raise ValueError("MALLEABLE_TF_SPLIT must be active, eigen or pool, not "
                             f"{os.environ['MALLEABLE_TF_SPLIT']!r}") from None
        try:
            tf.config.threading.set_intra_op_parallelism_threads(max_threads)
            tf.config.threading.set_inter_op_parallelism_threads(inter_max)
        except RuntimeError as exc:
            raise MalleableError("malleable_tf.init() must run before TensorFlow executes its "
                                 f"first op ({exc})") from exc
        native = load(tf)
        intra_pool = native.attach(inter_max)
        if intra_pool != max_threads:
            raise MalleableError(f"TensorFlow made an intra-op pool of {intra_pool} threads, "
                                 f"not {max_threads}")
        env_lr, env_ls = allowance.local_rank_and_size()
        lr = env_lr if local_rank is None else local_rank
        ls = env_ls if local_size is None else local_size
        rk = rank if rank is not None else int(os.environ.get(
            "OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", os.environ.get("HOROVOD_RANK", 0))))
        status = status_path or os.environ.get("MALLEABLE_TF_STATUS")
        fields = {"rank": rk, "local_rank": lr, "pid": os.getpid(),
                  "job": os.environ.get("SLURM_JOB_ID", "0"),
                  "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname()}
        status = None if not status else Path(str(status).format(**fields))
        target = os.environ.get("MALLEABLE_TF_TARGET")
        target_path = None if not target else Path(target.format(**fields))
        rt = Runtime(native, intra_pool=intra_pool, inter_pool=inter_max, local_rank=lr,
                     local_size=ls, rank=rk, follow=follow, poll_interval_s=poll_interval_s,
                     recheck_interval_s=recheck_interval_s,
                     status_path=status, target_path=target_path,
                     mask_restricts=source != "cgroup", split=split)
        _setup_logging()
        rt.install_signals(signals)
        rt.load_target()
        rt.refresh_allowance(reason="init") or rt.set_threads(reason="init")
        rt.start_watcher()
        _runtime = rt
        atexit.register(shutdown)
        return rt.state()


def _setup_logging() -> None:
    log = logging.getLogger("malleable_tf")
    if not log.handlers and os.environ.get("MALLEABLE_TF_LOG", "1") != "0":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def runtime() -> Runtime:
    if _runtime is None:
        raise NotInitialized()
    return _runtime


def set_threads(intra: int | None = None, inter: int | None = None) -> ThreadState:
    """Set the active intra-op and/or inter-op threads (1..pool size). When following the
    allowance, the active count is also capped by this rank's share of the allowed cores."""
    return runtime().set_threads(intra, inter)


def threads() -> ThreadState:
    return runtime().state()


def shutdown() -> None:
    """Unpark every thread for good (so the process can exit) and stop the watcher."""
    global _runtime
    with _init_lock:
        rt, _runtime = _runtime, None
    if rt is not None:
        rt.close()
