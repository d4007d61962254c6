"""``malleable agent``: the per-node daemon. Foreground; one reconcile cycle every interval,
at once on SIGUSR1 (the Epilog sends it), clean stop on SIGTERM/SIGINT."""
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
        for ch in result.changes:
            print(f"job {ch.job_id}: {sorted(ch.before)} -> {sorted(ch.after)} ({ch.reason})")
        for err in result.errors:
            print(f"error: {err}", file=sys.stderr)
        return 1 if result.errors else 0
    if metrics_port is not None:
        from .metrics import AgentMetrics
        metrics = AgentMetrics(config.node)
        metrics.serve(metrics_port)
        rec.on_cycle = lambda r: metrics.observe(r.snapshot, r.plan, len(r.changes),
                                                 len(r.errors), r.seconds)
    config.state_dir.mkdir(parents=True, exist_ok=True)
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
