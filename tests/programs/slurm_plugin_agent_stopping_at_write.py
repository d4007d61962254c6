"""A node agent that stops itself (SIGSTOP) just before its N-th cpuset write, holding the
node's lock, so a test can kill it (-9) or leave it hung at an exact point of a write sequence.
The hook is passed into the agent here; the production wiring has none and reads no switch.

    python slurm_plugin_agent_stopping_at_write.py agent N --config agent.json --node NODE \
        [--metrics-port P] [--metrics-per-job]

Its command line passes the Prolog's check of a hung agent before it kills one
(``slurm_plugin.node.procs.is_agent``: root, an "agent" argument, "slurm_plugin" in another),
as the real agent's does; hence the file's name and the "agent" word.
"""
from __future__ import annotations

import argparse
import os
import signal

from slurm_plugin.node.config import load_agent_config
from slurm_plugin.daemon.agent import run_agent
from slurm_plugin.logs import setup_logging


def stop_before_write(target: int):
    def hook(count: int, folder: str) -> None:
        if count == target:
            os.kill(os.getpid(), signal.SIGSTOP)
    return hook


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["agent"])
    parser.add_argument("write", type=int, help="the write to stop before (1 = the first)")
    parser.add_argument("--config", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--metrics-port", type=int)
    parser.add_argument("--metrics-per-job", action="store_true")
    args = parser.parse_args()
    if args.write < 1:
        parser.error("the write counts from 1")
    config = load_agent_config(args.config, node=args.node)
    setup_logging(f"agent[{config.node}]")
    return run_agent(config, metrics_port=args.metrics_port,
                     metrics_per_job=args.metrics_per_job,
                     before_write=stop_before_write(args.write))


if __name__ == "__main__":
    raise SystemExit(main())
