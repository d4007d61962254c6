"""``malleable cgroups``: this node's Slurm cgroup layout and CPU numbering (discovered), or a
job's CPUs."""
from __future__ import annotations

import argparse
import os

from slurm_plugin.settings import RootSettings, root_settings
from slurm_plugin.commands.common import CliError


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    cg = sub.add_parser("cgroups", help="this node's Slurm cgroup layout and CPU numbering "
                        "(discovered), or a job's CPUs")
    cg.add_argument("--node", help="the Slurm node name (default: $SLURMD_NODENAME or "
                    "$SLURM_NODENAME)")
    cg.add_argument("--slurm-conf", help="slurm.conf (cgroup.conf beside it); default "
                    "$SLURM_CONF")
    cg.add_argument("--job", type=int, help="print this job's CPUs on the node")
    cg.add_argument("--uid", type=int, default=os.getuid(), help="the job's owner (v1 paths)")
    cg.add_argument("--step", help="a step folder (step_0, step_batch) instead of the job's")
    cg.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The node's Slurm cgroup layout and CPU numbering as discovered; with --job, that job's
    CPUs (Linux's ids, as its cpuset holds them)."""
    from slurm_plugin.cgroups import discover_layout
    from slurm_plugin.node.cgroup_actuator import read_cpus
    from slurm_plugin.node.wiring import cpu_numbering
    from malleable_protocol import format_cpu_list
    node = args.node or root_settings().node
    if not node:
        raise CliError("which node? --node NAME (or run it inside a job)")
    layout = discover_layout(node, slurm_conf=args.slurm_conf)
    if args.job is None:
        print(layout.describe())
        numbering, refusal = cpu_numbering()
        if numbering is not None:
            print(f"CPU numbering: {numbering.describe()}")
            if numbering.layout.threads_per_core > 1:
                print(f"Lending: {lending_unit()}")
        else:
            print(f"CPU numbering: cannot be established ({refusal}); jobs keep Slurm's "
                  "allocation")
        return 0
    folder = layout.job_dir(args.uid, args.job)
    if args.step:
        folder = layout.step_dir(args.uid, args.job, args.step)
    cpus = read_cpus(folder)
    if cpus is None:
        raise CliError(f"no cgroup folder {folder}: job {args.job} is not running on {node}"
                       + (f" (or has no step {args.step})" if args.step else ""))
    print(format_cpu_list(cpus))
    return 0


def lending_unit() -> str:
    """How cores are lent on a hyperthreaded node, by what Slurm allocates there."""
    from malleable_protocol.runner import CommandError, run_command
    from slurm_plugin.slurm.parsers import allocation_unit
    try:
        config = run_command(["scontrol", "show", "config"], timeout=20).stdout
    except (CommandError, OSError):
        config = None
    return allocation_unit(config).lending
