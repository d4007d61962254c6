"""``malleable watcher``: the cluster's one reader of slurmctld, in the foreground."""
from __future__ import annotations

import argparse
from pathlib import Path

from malleable_protocol.runner import CommandError
from slurm_plugin.logs import add_log_level_option, dump_stacks_on_signal, setup_logging
from slurm_plugin.node.config import load_agent_config
from slurm_plugin.settings import DEFAULT_FEED_DIR, RootSettings, root_settings
from slurm_plugin.commands.common import (CliError, ip_address, port,
                                          positive_seconds)


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    wa = sub.add_parser("watcher", help="the cluster's one reader of slurmctld (foreground)")
    wa.add_argument("--config", help="agent.json: the feed folder and slurm.conf from it")
    wa.add_argument("--feed-dir", help="the feed folder (default: --config's, else "
                                       "$MALLEABLE_FEED_DIR, else /run/malleable/feed)")
    wa.add_argument("--slurm-conf", help="Slurm's configuration (default: Slurm's own)")
    wa.add_argument("--resync", type=positive_seconds, default=10.0,
                    help="seconds between polls when no event came (default %(default)s)")
    wa.add_argument("--once", action="store_true", help="one poll, then exit")
    wa.add_argument("--metrics-port", type=port,
                    help="serve the watcher's Prometheus metrics on this port")
    wa.add_argument("--metrics-address", type=ip_address, default="127.0.0.1",
                    help="address of the metrics port (default %(default)s)")
    wa.add_argument("--link-address", type=ip_address, default="0.0.0.0",
                    help="address the feed link listens on, when --config names its hosts "
                         "(default %(default)s: every interface; the port is --config's)")
    add_log_level_option(wa)
    wa.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading

    from slurm_plugin.feed import ClusterWatcher, FeedStore, WatcherConfig
    from slurm_plugin.feed.leader import Role
    from slurm_plugin.slurm import CliSlurmClient
    setup_logging("watcher", args.log_level)
    dump_stacks_on_signal()
    feed_dir, slurm_conf, agent = args.feed_dir, args.slurm_conf, None
    if args.config:   # the nodes' agent.json says where the feed is (the systemd unit's way)
        agent = load_agent_config(args.config)
        feed_dir = feed_dir or agent.watcher_feed_dir
        slurm_conf = slurm_conf or agent.slurm_conf
    config = WatcherConfig(
        feed_dir=Path(feed_dir) if feed_dir else root_settings().feed_dir or DEFAULT_FEED_DIR,
        slurm_conf=Path(slurm_conf) if slurm_conf else None, resync_s=args.resync)
    if config.slurm_conf is not None and not config.slurm_conf.is_file():
        raise CliError(f"no slurm.conf at {config.slurm_conf} (--slurm-conf)")
    client = CliSlurmClient(slurm_conf=config.slurm_conf)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    ctl = await_slurmctld(client, once=args.once, stop=stop)
    if ctl is None:
        return 0
    accounting = client if ctl.accounting_storage == "accounting_storage/slurmdbd" else None
    logging.getLogger(__name__).info(
        "jobs' usage: %s", "sacct (SystemComment) and usage.jsonl" if accounting
        else f"usage.jsonl only (AccountingStorageType={ctl.accounting_storage})")
    from slurm_plugin.feed.usage_runner import BackgroundUsage, InlineUsage
    # A poll never waits for slurmdbd (usage_runner.py); --once closes in its one poll.
    watcher = ClusterWatcher(config, client, FeedStore(config.feed_dir), accounting=accounting,
                             usage=InlineUsage() if args.once else BackgroundUsage())
    # slurmctld's hooks (job_submit.lua, PrologSlurmctld) append to the event file as SlurmUser.
    watcher.store.prepare()
    watcher.store.prepare_events(ctl.slurm_user_uid)
    if args.once:
        result = watcher.poll()
        print(f"{result.jobs} jobs, published {len(result.nodes_written)} node(s)")
        if result.error:
            raise CliError(f"the poll failed: {result.error}")
        return 0
    follow_controller(watcher, ctl, lambda: start_link_server(agent, watcher.store,
                                                              args.link_address))
    if watcher.role is Role.ACTIVE:
        watcher.link = start_link_server(agent, watcher.store, args.link_address)
    server = None
    if args.metrics_port is not None:
        from slurm_plugin.daemon.metrics import MetricsServer
        from slurm_plugin.feed.metrics import WatcherMetrics
        metrics = WatcherMetrics()
        server = MetricsServer(metrics, args.metrics_port, args.metrics_address)
        server.start()
        watcher.on_poll = metrics.observe
    try:
        watcher.run(stop.is_set)
    finally:
        if server is not None:
            server.stop()
        if watcher.link is not None:
            watcher.link.stop()
    return 0


def await_slurmctld(client, *, once: bool, stop):
    """slurmctld's configuration, once it answers: the watcher may start before slurmctld (a
    service started beside it, docker-slurm's controller) and waits for it, saying so (not
    with --once). None when stopped meanwhile."""
    import logging
    wait_s = 1.0
    while True:
        try:
            return client.controller_config()
        except CommandError as exc:
            if once:
                raise CliError(f"cannot read slurmctld's config ({exc}): is slurmctld up, and "
                               "--slurm-conf (or SLURM_CONF) its slurm.conf?") from None
            logging.getLogger(__name__).warning(
                "slurmctld does not answer yet (%s): trying again in %g s", exc, wait_s)
            if stop.wait(wait_s):
                return None
            wait_s = min(wait_s * 2, 30.0)


def follow_controller(watcher, ctl, start_link) -> None:
    """With backup controllers, the watcher beside the slurmctld in control is the active one
    (feed/leader.py); the others stand by with their feed link closed, so the agents' links
    go to the active one. One controller: nothing to follow."""
    if len(ctl.controllers) <= 1:
        return
    import logging
    import socket
    import time
    from pathlib import Path

    from slurm_plugin.feed.leader import HeartbeatReader, Role, controller_index, decide_role
    mine = controller_index(ctl.controllers, socket.gethostname())
    heartbeat = HeartbeatReader(Path(ctl.state_save)) if ctl.state_save else lambda: None
    watcher.role_of = lambda: decide_role(ctl, mine, heartbeat(), time.time(), watcher.role)
    # Every watcher starts standing by, its link closed, and takes over as any does (after
    # takeover_wait_s): a primary restarting takes control back at once, while the backup's
    # watcher is still active until its next role check.
    watcher.role = Role.STANDBY
    logging.getLogger(__name__).warning("this watcher starts standby: %s", watcher.role_of()[1])

    def on_role(role) -> None:
        if role is Role.ACTIVE and watcher.link is None:
            watcher.link = start_link()
        elif role is Role.STANDBY and watcher.link is not None:
            watcher.link.stop()
            watcher.link = None
    watcher.on_role = on_role


def start_link_server(agent, store, address: str):
    """The feed link's listening end (feed/link_server.py) when agent.json names the link's
    hosts; None otherwise (the nodes read the watcher's folder itself)."""
    if agent is None or not agent.feed_link_hosts:
        return None
    import logging

    from slurm_plugin.feed import FeedStore
    from slurm_plugin.feed.link import link_auth
    from slurm_plugin.feed.link_server import LinkServer
    auth = link_auth(agent.feed_link_auth,
                     None if agent.munge_socket is None else str(agent.munge_socket))
    server = LinkServer(FeedStore(store.feed_dir), auth, port=agent.feed_link_port,
                        address=address, on_poke=store.poke_watcher)
    try:
        server.start()
    except OSError as exc:
        raise CliError(f"the feed link cannot listen on {address}:{agent.feed_link_port}: "
                       f"{exc.strerror or exc}") from None
    logging.getLogger(__name__).info("feed link: listening on %s:%d (%s)", address,
                                     server.port, agent.feed_link_auth.split(":")[0])
    return server
