"""The local Slurm mini-cluster: ``malleable cluster up|down|status|env``. The development
cluster ships with a checkout, not with the node package: it is imported when the command runs."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from malleable_policy.model import Policy
from slurm_plugin.commands.common import POLICIES, CliError, development_cluster, say
from slurm_plugin.settings import RootSettings

if TYPE_CHECKING:
    from slurm_plugin.cluster.local import ClusterStatus


def format_status(st: ClusterStatus) -> str:
    lines = [f"cluster folder: {st.root}"]
    if not st.running:
        return "\n".join(lines + ["not running"])
    lines.append("daemons: " + ", ".join(f"{n}={'up' if ok else 'DOWN'}" for n, ok in st.running.items()))
    if not st.controller_up:
        return "\n".join(lines + ["slurmctld does not answer"])
    lines.append(f"{'NODE':<8} {'STATE':<12} {'CPUS':>4} {'ALLOC':>5}")
    for n in st.nodes:
        state = n.state + ("+" + "+".join(n.state_flags) if n.state_flags else "")
        lines.append(f"{n.name:<8} {state:<12} {n.cpus:>4} {n.alloc_cpus:>5}")
    lines.append(f"{'JOBID':>6} {'USER':<8} {'STATE':<11} {'NODES':<12} CPU_IDS")
    for j in st.jobs:
        ids = " ".join(f"{node}:{','.join(map(str, sorted(c)))}" for node, c in j.cpu_ids.items())
        lines.append(f"{j.job_id:>6} {j.user:<8} {j.state.value:<11} {','.join(j.nodes) or '-':<12} {ids}")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    cl = sub.add_parser("cluster", help="the local Slurm mini-cluster")
    cl.add_argument("action", choices=["up", "down", "status", "env"])
    cl.add_argument("--dir", default=str(env.cluster_dir),
                    help="folder for all state, logs and sockets (default %(default)s, "
                         "or $MALLEABLE_CLUSTER_DIR)")
    cl.add_argument("--nodes", type=int, default=3)
    cl.add_argument("--port-base", type=int, default=17817,
                    help="slurmctld port; node i listens on port-base+i")
    cl.add_argument("--node-prefix", default="n")
    cl.add_argument("--name", default="malleable", help="Slurm ClusterName")
    cl.add_argument("--cpus-per-node", type=int, default=None,
                    help="declare this many CPUs per node (default: the real count)")
    cl.add_argument("--timeout", type=float, default=90.0)
    cl.add_argument("--json", action="store_true", help="status as JSON")
    cl.add_argument("--no-agents", action="store_true",
                    help="do not install the hooks nor start an agent per node")
    cl.add_argument("--policy", default="lend-idle", choices=POLICIES)
    cl.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    dev = development_cluster()
    root = Path(args.dir).absolute()
    if args.action == "up":
        spec = dev.default_spec(root, nodes=args.nodes, port_base=args.port_base,
                            node_prefix=args.node_prefix, name=args.name,
                            cpus_per_node=args.cpus_per_node)
        cluster = dev.LocalCluster(spec)
        cluster.up(timeout_s=args.timeout, log=say,
                   agents=None if args.no_agents else Policy(args.policy))
        print("\n".join(cluster.env_lines()))
        return 0
    cluster = dev.LocalCluster.load(root)
    if args.action == "down":
        problems = cluster.down()
        for p in problems:
            say(f"problem: {p}")
        if problems:
            raise CliError(f"cluster down, with {len(problems)} problem(s) (above)")
        say("cluster down")
        return 0
    if args.action == "status":
        st = cluster.status()
        if args.json:
            print(json.dumps({"root": str(st.root), "daemons": st.running,
                              "controller_up": st.controller_up,
                              "nodes": [{"name": n.name, "state": n.state, "cpus": n.cpus,
                                         "alloc_cpus": n.alloc_cpus} for n in st.nodes],
                              "jobs": [{"job_id": j.job_id, "user": j.user, "state": j.state.value,
                                        "nodes": list(j.nodes),
                                        "cpu_ids": {k: sorted(v) for k, v in j.cpu_ids.items()}}
                                       for j in st.jobs]}, indent=2))
        else:
            print(format_status(st))
        if not st.running:
            raise CliError(f"no cluster running in {st.root}: start it with `malleable cluster up "
                           f"--dir {st.root}`")
        down = [n for n, ok in st.running.items() if not ok]
        if down:
            raise CliError(f"daemon(s) down in {st.root}: {', '.join(down)} (their logs are in "
                           f"the cluster folder; `malleable cluster down` then `up` restarts)")
        if not st.controller_up:
            raise CliError(f"slurmctld of {st.root} does not answer (scontrol ping)")
        return 0
    if args.action == "env":
        print("\n".join(cluster.env_lines()))
        return 0
    raise AssertionError(args.action)
