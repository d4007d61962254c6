"""``malleable agent``: the per-node daemon. Foreground; a reconcile cycle every interval, at
once when the node's feed changes or on SIGUSR1 (the Epilog sends it), clean stop on
SIGTERM/SIGINT. It never asks slurmctld anything."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Callable

from ..cgroups import LayoutUnknown, SlurmCgroupLayout
from .config import AgentConfig
from .hooks import make_reconciler, node_layout

log = logging.getLogger("malleable.agent")


def await_layout(config: AgentConfig, *, wait_s: float,
                 discover: Callable[[AgentConfig], SlurmCgroupLayout] = node_layout,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> SlurmCgroupLayout:
    """The node's layout, waiting up to ``wait_s`` for slurmd to make its folders (an agent
    started beside slurmd); then ``LayoutUnknown``, saying what was looked for."""
    deadline = clock() + wait_s
    while True:
        try:
            return discover(config)
        except LayoutUnknown as exc:
            if clock() >= deadline:
                raise
            log.info("waiting for slurmd's cgroup folders: %s", exc)
            sleep(1.0)


def run_agent(config: AgentConfig, *, once: bool = False, metrics_port: int | None = None,
              layout_wait_s: float = 30.0) -> int:
    """Refuses to start (``LayoutUnknown``) on a node whose cgroup layout cannot be told."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s agent[" + config.node + "] %(message)s")
    layout = await_layout(config, wait_s=0.0 if once else layout_wait_s)
    log.info("cgroup layout: %s", layout.describe())
    rec = make_reconciler(config, layout)
    if once:
        result = rec.cycle()
        for o in result.outcomes:
            a = o.action
            print(f"job {a.job_id}: {a.kind.value} {sorted(a.before)} -> {sorted(a.after)} "
                  f"({a.reason.value}) {o.status.value}")
        for failure in result.failures:
            print(f"error: {failure}", file=sys.stderr)
        return 1 if result.failures else 0
    if metrics_port is not None:
        from .metrics import AgentMetrics
        metrics = AgentMetrics(config.node)
        metrics.serve(metrics_port)
        rec.on_cycle = metrics.observe
    config.pid_file.write_text(str(os.getpid()))
    stop = threading.Event()
    wake = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: (stop.set(), wake.set()))
    signal.signal(signal.SIGINT, lambda *_: (stop.set(), wake.set()))
    signal.signal(signal.SIGUSR1, lambda *_: wake.set())
    try:
        rec.run(stop.is_set, wake)
    finally:
        try:
            if config.pid_file.read_text() == str(os.getpid()):
                config.pid_file.unlink()
        except OSError:
            pass
    return 0
