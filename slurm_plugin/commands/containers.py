"""``malleable containers``: the co-scheduler for Docker containers on this host."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from malleable_policy.model import Policy
from slurm_plugin.logs import add_log_level_option, setup_logging
from slurm_plugin.settings import RootSettings
from slurm_plugin.commands.common import POLICIES, CliError, positive_seconds


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    co = sub.add_parser("containers", help="the co-scheduler for Docker containers labelled "
                        "malleable=min=N,max=N|node,weight=N on this host (foreground)")
    co.add_argument("--policy", default="lend-idle", choices=POLICIES)
    co.add_argument("--cpus", help="the host's CPUs it hands out (default: its own affinity)")
    co.add_argument("--state-dir", default="/run/malleable/containers",
                    help="root-only folder of its admissions (default %(default)s)")
    co.add_argument("--interval", type=positive_seconds, default=0.5,
                    help="seconds between cycles")
    co.add_argument("--once", action="store_true", help="one cycle, then exit")
    add_log_level_option(co)
    co.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    import signal
    import socket
    import threading

    from malleable_protocol import format_cpu_list, parse_cpu_list
    from slurm_plugin.containers import ContainerCoScheduler, DockerCli
    setup_logging("containers", args.log_level)
    cpus = parse_cpu_list(args.cpus) if args.cpus else frozenset(os.sched_getaffinity(0))
    cosched = ContainerCoScheduler(socket.gethostname(), cpus, Policy(args.policy),
                                   Path(args.state_dir), DockerCli())
    if args.once:
        result = cosched.cycle()
        for o in result.outcomes:
            print(f"{o.action.job_id}: {format_cpu_list(o.action.before) or '-'} -> "
                  f"{format_cpu_list(o.action.after)} {o.status.value} {o.error}".rstrip())
        for name in result.waiting:
            print(f"{name}: waits for free cores")
        for name in result.refused:
            print(f"{name}: label refused")
        failed = [o for o in result.outcomes if o.status.value != "applied"]
        if failed:
            raise CliError(f"{len(failed)} of {len(result.outcomes)} change(s) not applied "
                           "(above)")
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cosched.run(stop.is_set, interval_s=args.interval)
    return 0
