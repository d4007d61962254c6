"""``malleable disable`` and ``malleable enable``: the site's kill switch (root).

``disable`` throws it on this node (``node.switch``) and runs one cycle at once under the node's
lock, as a hook does, so every job holds exactly its Slurm allocation when it returns (checked
on the real cgroup tree, and said); the running agent keeps it so. ``enable`` lifts it and wakes
the agent. The setting ``"enabled": false`` in agent.json does what ``disable`` does, for good.

With ``--site`` (where the feed folder is: the watcher's host), for every node at once: the
switch goes into the feed folder, the watcher puts it into every node's feed at once (the
command tells it through the event file), and each agent holds every job to its allocation at
the cycle that feed wakes. The command waits until every node's agent reports so (its report
in the feed folder), and names those that did not within ``--wait``."""
from __future__ import annotations

import argparse
import signal
import time

from slurm_plugin.commands.common import DEFAULT_AGENT_CONFIG, CliError
from slurm_plugin.settings import RootSettings


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    for name, what in (("disable", "switch malleability off on this node (root): every job "
                        "back to exactly its Slurm allocation now, nothing lent until enable"),
                       ("enable", "switch malleability back on on this node (root)")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--config", default=DEFAULT_AGENT_CONFIG,
                       help="agent.json (default %(default)s, the install guide's)")
        p.add_argument("--node", help="the node (default: agent.json's, or SLURMD_NODENAME)")
        p.add_argument("--site", action="store_true",
                       help="every node of the cluster, through the feed (run it where the "
                            "feed folder is, as root)")
        p.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                       help="with --site: how long to wait for every node's agent to report "
                            "(default %(default)s)")
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


def _await_site(store, *, off: bool, wait_s: float) -> tuple[list[str], list[str]]:
    """Nodes of the feed whose agents report the site's switch as ``off`` wants, and those
    that do not yet after ``wait_s``."""
    deadline = time.monotonic() + wait_s

    def agrees(node: str) -> bool:
        report = store.read_report(node)
        held = report is not None and report.held is not None and "for the site" in report.held
        return held == off
    while True:
        store.invalidate()
        nodes = store.node_names()
        done = [n for n in nodes if agrees(n)]
        if len(done) == len(nodes) or time.monotonic() >= deadline:
            return done, [n for n in nodes if n not in done]
        time.sleep(0.5)


def _site(args: argparse.Namespace, config, *, off: bool) -> int:
    from slurm_plugin.feed.store import FeedStore
    store = FeedStore(config.watcher_feed_dir)      # the watcher's folder, on its host
    if off:
        store.switch_site_off(args.reason)
    elif not store.switch_site_on():
        print("the site's switch was not thrown")
    done, late = _await_site(store, off=off, wait_s=args.wait)
    what = "hold every job to its allocation" if off else "are malleable again"
    print(f"site: {len(done)} node(s) {what}" + (f"; not (yet) reported by: {', '.join(late)}"
                                                 if late else ""))
    if late:
        raise CliError(f"{len(late)} node(s) did not report within {args.wait:g} s (a dead "
                       "agent or watcher?): the switch stays written; run this again or "
                       "'malleable disable' on those nodes")
    return 0


def run_disable(args: argparse.Namespace) -> int:
    from slurm_plugin.node.safety import jobs_off_their_allocation
    from slurm_plugin.node.switch import switch_off
    from slurm_plugin.node.wiring import make_reconciler
    config = _config(args)
    if args.site:
        return _site(args, config, off=True)
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
    if args.site:
        return _site(args, config, off=False)
    lifted = switch_on(config)
    still = switched_off(config)
    if still is not None:
        raise CliError(f"node {config.node}: {still}; set it to true in {args.config}")
    woke = _wake_agent(config)
    print(f"node {config.node}: malleability switched on"
          + ("" if lifted else " (it was not switched off by 'malleable disable')")
          + ("" if woke else "; no agent running to act on it"))
    return 0
