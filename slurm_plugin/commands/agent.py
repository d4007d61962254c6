"""``malleable agent``: the per-node co-scheduler, in the foreground."""
from __future__ import annotations

import argparse

from malleable_policy.model import Policy
from slurm_plugin.logs import add_log_level_option, dump_stacks_on_signal, setup_logging
from slurm_plugin.node.config import load_agent_config
from slurm_plugin.settings import RootSettings
from slurm_plugin.commands.common import (POLICIES, ip_address, port,
                                          positive_seconds)


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    ag = sub.add_parser("agent", help="the per-node co-scheduler (foreground)")
    ag.add_argument("--config", required=True, help="agent.json (from install-slurm-hooks)")
    ag.add_argument("--node", help="this node's Slurm name (default: from the config)")
    ag.add_argument("--policy", choices=POLICIES)
    ag.add_argument("--once", action="store_true", help="one reconcile cycle, then exit")
    ag.add_argument("--metrics-port", type=port,
                    help="serve Prometheus metrics on ADDR:PORT (a port below 1024: no job "
                         "user can take it first; if it is taken, the agent runs on and "
                         "retries)")
    ag.add_argument("--metrics-address", "--metrics-addr", dest="metrics_address",
                    type=ip_address, default="127.0.0.1", metavar="ADDR",
                    help="the IP address the metrics are served on (default %(default)s: this "
                         "node only; 0.0.0.0, or the node's own address, for a central "
                         "Prometheus)")
    ag.add_argument("--metrics-retry", type=positive_seconds, default=5.0, metavar="SECONDS",
                    help="seconds between attempts to bind a taken metrics port "
                         "(default %(default)s)")
    ag.add_argument("--metrics-per-job", action="store_true",
                    help="add each running job's series (its id as a label): anyone who can "
                         "reach the port then sees which jobs run here, which Slurm's "
                         "PrivateData=jobs hides; without it, node totals only")
    add_log_level_option(ag)
    ag.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    from slurm_plugin.daemon.agent import run_agent
    overrides = {}
    if args.node:
        overrides["node"] = args.node
    if args.policy:
        overrides["policy"] = Policy(args.policy)
    config = load_agent_config(args.config, **overrides)
    setup_logging(f"agent[{config.node}]", args.log_level)
    dump_stacks_on_signal()
    return run_agent(config, once=args.once, metrics_port=args.metrics_port,
                     metrics_addr=args.metrics_address, metrics_retry_s=args.metrics_retry,
                     metrics_per_job=args.metrics_per_job)
