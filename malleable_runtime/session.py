"""One process's runtime, from its environment to a running watcher: what every framework's
``init()`` does around the part only it can do (sizing its pools, building its adapter).

The order matters and is kept here once: signals routed before any status record names the
reload signal; the target read before the first resize; the first resize before the watcher
starts."""
from __future__ import annotations

import inspect
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from malleable_protocol import RunLayout

from .adapter import ThreadPools, Wakeups
from .control import Action
from .runtime import Runtime
from .settings import AllowanceSource, Pinning, Settings, env_signals

S = TypeVar("S", bound=Settings)

# The process's one runtime, started by a framework package's init(): its API and its helpers
# (a Keras callback, a PyTorch hook) find it here.
_running: Runtime | None = None


def running() -> Runtime | None:
    return _running


def set_running(rt: Runtime | None) -> None:
    global _running
    _running = rt


def ignore_signals_until_init(environ: Mapping[str, str]) -> None:
    """A control signal that arrives before init() must not kill the process (the default action
    of SIGUSR1 and of every real-time signal): ignore the configured signals until init()
    installs the real handler. Called by a framework package when it is imported."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        for signo in env_signals(environ):
            if signal.getsignal(signo) == signal.SIG_DFL:
                signal.signal(signo, signal.SIG_IGN)
    except ValueError:
        pass  # a bad MALLEABLE_TF_SIGNALS is reported by init()


def settings_from_env(read: Callable[[Mapping[str, str]], S]) -> S:
    """The environment's settings (``read``: a Settings class's from_env). Inside a Slurm job
    whose folder the node's Prolog made (the co-scheduler runs), a rank started without
    malleable-srun (``python train.py`` in a batch script or under salloc) first gets what
    malleable-srun would have set, where the user set nothing: its status record, its node's
    target, the cgroup as allowance, a pool that can grow to the node (in os.environ, as
    malleable-srun sets them: what it starts sees them too)."""
    settings = read(os.environ)
    if settings.status is not None or settings.job_id is None:
        return settings
    try:
        layout = RunLayout(settings.run_dir)
        if not layout.job_dir(settings.job_id).is_dir():
            return settings
        defaults = layout.rank_env(settings.job_id)
    except ValueError:
        return settings
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    return read(os.environ)


def setup_logging(enabled: bool, *packages: str) -> None:
    """Log lines to stderr, bare, from the runtime's loggers and the framework package's."""
    for name in ("malleable_runtime", *packages):
        log = logging.getLogger(name)
        if not log.handlers and enabled:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO)
            log.propagate = False


@dataclass(frozen=True)
class Placement:
    """Where this process runs, as init() settled it (arguments over the environment)."""

    rank: int
    local_rank: int
    local_size: int
    status_path: Path | None
    target_path: Path | None
    fields: Mapping[str, object]    # what the path templates were filled with


def place(env: Settings, *, status_path: str | os.PathLike[str] | None, local_rank: int | None,
          local_size: int | None, rank: int | None) -> Placement:
    lr = env.local_rank if local_rank is None else local_rank
    ls = env.local_size if local_size is None else local_size
    rk = env.rank if rank is None else rank
    status = status_path or env.status
    fields = {"rank": rk, "local_rank": lr, "pid": os.getpid(), "job": str(env.job_id or 0),
              "step": env.step, "node": env.node or socket.gethostname()}
    return Placement(rk, lr, ls, None if not status else Path(str(status).format(**fields)),
                     None if not env.target else Path(env.target.format(**fields)), fields)


def start_runtime(pools: ThreadPools, wakeups: Wakeups, env: Settings, where: Placement, *,
                  follow: bool, signals: Mapping[int, Action], poll_interval_s: float,
                  recheck_interval_s: float,
                  before_watcher: Callable[[Runtime], None] | None = None) -> Runtime:
    """Build the runtime on a framework's adapter and start it; ``before_watcher`` runs after the
    first resize (an adapter's step counting)."""
    rt = Runtime(pools, wakeups, local_rank=where.local_rank, local_size=where.local_size,
                 rank=where.rank, follow=follow, poll_interval_s=poll_interval_s,
                 recheck_interval_s=recheck_interval_s, status_path=where.status_path,
                 target_path=where.target_path,
                 mask_restricts=env.allowance is AllowanceSource.AUTO,
                 pin_share=env.pin is Pinning.SHARE, node=env.node)
    rt.install_signals(signals)   # before any status record names the reload signal
    rt.load_target()
    rt.refresh_allowance(reason="init") or rt.set_threads(reason="init")
    if before_watcher is not None:
        before_watcher(rt)
    rt.start_watcher()
    return rt


def check_join(init: Callable[..., Any], asked: Mapping[str, object],
               have: Mapping[str, object], *, package: str, env_names: str) -> None:
    """A second ``init()`` (the script's, after the package's runner started the runtime): every
    argument it gives must match what the runtime runs with (``have``); else MalleableError
    names each difference and how to settle it."""
    from .runtime import MalleableError
    defaults = {n: p.default for n, p in inspect.signature(init).parameters.items()}
    conflicts = []
    for name, value in asked.items():
        if value is None or (name in defaults and value is defaults[name]):
            continue
        current = have.get(name)
        if name == "status_path":
            fields = have.get("_fields", {})
            value = Path(str(value).format(**(fields if isinstance(fields, dict) else {})))
        if value != current or isinstance(value, bool) != isinstance(current, bool):
            conflicts.append(f"{name}={value!r} (it runs with {current!r})")
    if conflicts:
        raise MalleableError(
            f"{package}.init() already ran ({package}.run started it, before the script) "
            "with other settings than this call asks: " + ", ".join(conflicts) + ". Drop these "
            f"arguments or set them in the environment ({env_names}), or run the script "
            f"without {package}.run (malleable-srun --no-auto-init)")
