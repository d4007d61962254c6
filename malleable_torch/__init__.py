"""malleable_torch: PyTorch's intra-op threads follow the cores of a running process.

    import malleable_torch
    malleable_torch.init()                  # once, before training
    malleable_torch.set_threads(intra=1)    # from anywhere, at any time
    malleable_torch.threads()               # ThreadState(intra_active=1, intra_pool=..., ...)

or, with no change to the script: ``python -m malleable_torch.run train.py`` (under srun, also
for ``torch.distributed``: ``malleable_torch.distributed``).

By default the training thread's intra-op count (``torch.set_num_threads``) follows the
process's CPU allowance (affinity mask, cpuset cgroup, CPU quota) and the co-scheduler's target,
split among the ranks that share the node (torchrun's LOCAL_WORLD_SIZE, srun's tasks per node),
and a control signal (SIGRTMIN+3) makes the runtime look at once. The count is a setting of the
thread that runs the ops, so a resize is applied there: in the main thread at its next bytecode,
or at the next optimizer step (``malleable_torch.threads``). Steps are counted from every
optimizer's ``step()`` (MALLEABLE_TF_COUNT_STEPS=0: not), or by ``malleable_torch.step()``.

The environment is the runtime's (``malleable_runtime.settings``: MALLEABLE_TF_STATUS,
MALLEABLE_TF_TARGET, MALLEABLE_TF_SIGNALS, MALLEABLE_TF_MAX_THREADS, ...: the names are shared
with TensorFlow's package). ``max_threads`` defaults to the CPUs this process may use at init,
not to PyTorch's count then: torchrun starts every worker with OMP_NUM_THREADS=1, a count
meant for a node it cannot see, which the runtime replaces with the rank's share.

What does not follow (docs/pytorch.md): PyTorch's inter-op pool, sized once; DataLoader
workers, processes of their own. No native library: nothing is compiled.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading

from malleable_runtime import session
from malleable_runtime.control import Action
from malleable_runtime.python_wakeups import PythonWakeups
from malleable_runtime.runtime import MalleableError, NotInitialized, Runtime
from malleable_runtime.session import (ignore_signals_until_init, place, settings_from_env,
                                       setup_logging, start_runtime)
from malleable_runtime.settings import Settings
from malleable_runtime.state import ThreadState

from .threads import TorchThreads

# The API, and its one front door (tests/unit/test_package_edges.py checks every importer).
__all__ = ["init", "set_threads", "threads", "step", "shutdown", "runtime", "ThreadState",
           "Action", "MalleableError", "NotInitialized"]

# The Python poll holds the GIL for each look: 20 ms keeps its cost near nothing; the agent's
# signal, not the poll, is what a resize waits for.
DEFAULT_POLL_INTERVAL_S = 0.02

log = logging.getLogger(__name__)
_init_lock = threading.Lock()
_settings: dict | None = None
_joinable = False      # malleable_torch.run sets it: a script's own init() then joins
_hooks: list = []

ignore_signals_until_init(os.environ)


def init(max_threads: int | None = None, *, follow: bool | None = None,
         signals: dict[int, Action] | None = None,
         poll_interval_s: float = DEFAULT_POLL_INTERVAL_S, recheck_interval_s: float = 1.0,
         status_path: str | os.PathLike | None = None, local_rank: int | None = None,
         local_size: int | None = None, rank: int | None = None,
         count_steps: bool | None = None) -> ThreadState:
    """Start managing the intra-op threads of the calling thread (the training thread; the
    optimizer hooks follow it if training moves to another). ``max_threads``: the most it may
    run (default: the CPUs this process may use now). The control signals are installed only
    when called from the main thread (Python's rule); elsewhere the runtime follows by its
    poll alone and says so in the log. Under ``python -m malleable_torch.run`` the runner has
    already called it: a call here then returns the running state, and raises MalleableError
    only if it asks for other settings."""
    global _settings
    asked = dict(locals())
    with _init_lock:
        if session.running() is not None:
            if not _joinable:
                raise MalleableError("malleable_torch.init() already ran")
            session.check_join(init, asked, _settings or {}, package="malleable_torch",
                               env_names="MALLEABLE_TF_MAX_THREADS, MALLEABLE_TF_SIGNALS, "
                                         "MALLEABLE_TF_STATUS, MALLEABLE_TF_FOLLOW")
            return runtime().state()
        env = settings_from_env(Settings.from_env)
        if max_threads is not None and (isinstance(max_threads, bool) or
                                        not isinstance(max_threads, int) or
                                        not 1 <= max_threads <= 4096):
            raise ValueError(f"max_threads must be an int in 1..4096, not {max_threads!r}")
        follow = env.follow if follow is None else follow
        count_steps = env.count_steps if count_steps is None else count_steps
        signals = dict(env.signals) if signals is None else signals
        setup_logging(env.log, "malleable_torch")
        if signals and threading.current_thread() is not threading.main_thread():
            log.warning(
                "malleable_torch: init() outside the main thread: no control signal is "
                "installed (Python installs handlers in the main thread only); the runtime "
                "follows the allowance by its poll")
            signals = {}

        import torch

        max_threads = max_threads or env.max_threads or len(os.sched_getaffinity(0))
        wakeups = PythonWakeups()
        threads = TorchThreads(torch.set_num_threads, torch.get_num_threads,
                               intra_pool=max_threads, wake_main_thread=wakeups.wake_main_thread)
        wakeups.on_main_thread = threads.on_main_thread
        where = place(env, status_path=status_path, local_rank=local_rank,
                      local_size=local_size, rank=rank)

        def hook_optimizers(rt: Runtime) -> None:
            from . import hooks
            _hooks.extend(hooks.install(threads, rt.step if count_steps else None))

        rt = start_runtime(threads, wakeups, env, where, follow=follow, signals=signals,
                           poll_interval_s=poll_interval_s,
                           recheck_interval_s=recheck_interval_s,
                           before_watcher=hook_optimizers)
        _settings = {**asked, "max_threads": max_threads, "follow": follow,
                     "signals": dict(signals), "status_path": where.status_path,
                     "local_rank": where.local_rank, "local_size": where.local_size,
                     "rank": where.rank, "count_steps": count_steps,
                     "_fields": dict(where.fields)}
        session.set_running(rt)
        atexit.register(shutdown)
        return rt.state()


def runtime() -> Runtime:
    rt = session.running()
    if rt is None:
        raise NotInitialized()
    return rt


def set_threads(intra: int | None = None) -> ThreadState:
    """Set the active intra-op threads (1..max_threads). When following the allowance, the count
    is also capped by this rank's share of the allowed cores. Called in the training thread it
    applies at once; elsewhere, at the training thread's next bytecode or optimizer step."""
    return runtime().set_threads(intra)


def threads() -> ThreadState:
    return runtime().state()


def step(n: int = 1) -> None:
    """Count ``n`` training steps done just now (loops without an optimizer, or
    ``count_steps=False``), and apply a posted resize when called in the training thread.
    Before ``init()`` and after ``shutdown()`` it does nothing."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"step(n): n must be an int >= 0, not {n!r}")
    rt = session.running()
    if rt is not None:
        rt.step(n)
        pools = rt.pools
        if isinstance(pools, TorchThreads):
            pools.training_thread_is_here()


def shutdown() -> None:
    """Stop the watcher and the hooks; the threads keep the count they have."""
    with _init_lock:
        rt = session.running()
        session.set_running(None)
        hooks, _hooks[:] = list(_hooks), []
    for handle in hooks:
        handle.remove()
    if rt is not None:
        rt.close()
