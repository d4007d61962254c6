"""``malleable agent``: the per-node daemon. Foreground; a reconcile cycle every interval, at
once when the node's feed changes or on SIGUSR1 (the Epilog sends it), clean stop on
SIGTERM/SIGINT. It never asks slurmctld anything."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from .config import AgentConfig
from .hooks import make_reconciler


def run_agent(config: AgentConfig, *, once: bool = False, metrics_port: int | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s agent[" + config.node + "] %(message)s")
    rec = make_reconciler(config)
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
