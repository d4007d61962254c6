"""``malleable disable`` and ``malleable enable``: the site's kill switch on this node (root).

``disable`` throws it (``node.switch``) and runs one cycle at once under the node's lock, as a
hook does, so every job holds exactly its Slurm allocation when it returns (checked on the real
cgroup tree, and said); the running agent keeps it so. ``enable`` lifts it and wakes the agent.
The setting ``"enabled": false`` in agent.json does what ``disable`` does, for good."""
from __future__ import annotations

import argparse
import signal
import time

from slurm_plugin.commands.common import CliError
from slurm_plugin.settings import RootSettings


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    for name, what in (("disable", "switch malleability off on this node (root): every job "
                        "back to exactly its Slurm allocation now, nothing lent until enable"),
                       ("enable", "switch malleability back on on this node (root)")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--config", required=True, help="agent.json (from install-slurm-hooks)")
        p.add_argument("--node", help="the node (default: agent.json's, or SLURMD_NODENAME)")
        if name == "disable":
            p.add_argument("--reason", default="", help="said in the event log and by doctor")
        p.set_defaults(func=run_disable if name == "disable" else run_enable)


def _config(args: argparse.Namespace):
    from slurm_plugin.node.config import load_agent_config
    return load_agent_config(args.config, **({"node": args.node} if args.node else {}))


def _wake_agent(config) -> bool:
    from slurm_plugin.node.procs import agent_pid, is_agent, signal_verified
    pid = agent_pid(config.pid_file)
    return pid is not None and signal_verified(pid, signal.SIGUSR1, is_agent)


def run_disable(args: argparse.Namespace) -> int:
    from slurm_plugin.node.safety import jobs_off_their_allocation
    from slurm_plugin.node.switch import switch_off
    from slurm_plugin.node.wiring import make_reconciler
    config = _config(args)
    switch_off(config, args.reason)
    t0 = time.monotonic()
    result = make_reconciler(config).cycle(lock_timeout_s=config.prolog_lock_timeout_s)
    _wake_agent(config)
    off = jobs_off_their_allocation(config)
    if result.errors or off:
        raise CliError(f"node {config.node}: switched off, but the cycle did not bring every "
                       f"job back: {'; '.join(result.errors + off)}")
    print(f"node {config.node}: malleability switched off; every job holds exactly its "
          f"allocation ({len(result.applied)} resized in {time.monotonic() - t0:.2f} s)")
    return 0


def run_enable(args: argparse.Namespace) -> int:
    from slurm_plugin.node.switch import switch_on, switched_off
    config = _config(args)
    lifted = switch_on(config)
    still = switched_off(config)
    if still is not None:
        raise CliError(f"node {config.node}: {still}; set it to true in {args.config}")
    woke = _wake_agent(config)
    print(f"node {config.node}: malleability switched on"
          + ("" if lifted else " (it was not switched off by 'malleable disable')")
          + ("" if woke else "; no agent running to act on it"))
    return 0
