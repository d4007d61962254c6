"""The ``malleable`` command.

Exit codes, the same for every subcommand: 0 done; 1 it could not be done (a missing feed
folder, an unknown job, no cluster, a Slurm command that failed, a bad config file...), said in
one line on stderr as ``malleable <command>: what was wrong, and what to do``; 2 the command
line itself is wrong (argparse's usage errors)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from slurm_plugin.cluster import DEFAULT_ROOT, LocalCluster, default_spec
from slurm_plugin.cluster.local import ClusterStatus
from malleable_policy.model import Policy
from slurm_plugin.logs import add_log_level_option, setup_logging
from slurm_plugin.node.config import load_agent_config
from slurm_plugin.spank import SpankBuildError
from malleable_protocol.runner import CommandError
from slurm_plugin.slurm import UnknownJob
from malleable_protocol.errors import FixableError
from slurm_plugin.settings import root_settings


POLICIES = [p.value for p in Policy]


class CliError(FixableError):
    """A command cannot do what it was asked; the message says what was wrong and what to do
    (exit 1)."""


# What a command fails with when the world is not as asked (files, Slurm, the cluster, the
# node, a request): one line on stderr and exit 1. Anything else is a bug and keeps its
# traceback (ValueError and OSError included: where one is the user's to fix, the code that
# knows says so with a FixableError).
RUNTIME_ERRORS = (FixableError,)


def _log(msg: str) -> None:
    print(f"[malleable] {msg}", file=sys.stderr, flush=True)


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


def _cluster_cmd(args: argparse.Namespace) -> int:
    root = Path(args.dir).absolute()
    if args.action == "up":
        spec = default_spec(root, nodes=args.nodes, port_base=args.port_base,
                            node_prefix=args.node_prefix, name=args.name,
                            cpus_per_node=args.cpus_per_node)
        cluster = LocalCluster(spec)
        cluster.up(timeout_s=args.timeout, log=_log,
                   agents=None if args.no_agents else Policy(args.policy))
        print("\n".join(cluster.env_lines()))
        return 0
    cluster = LocalCluster.load(root)
    if args.action == "down":
        problems = cluster.down()
        for p in problems:
            _log(f"problem: {p}")
        if problems:
            raise CliError(f"cluster down, with {len(problems)} problem(s) (above)")
        _log("cluster down")
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


def _agent_cmd(args: argparse.Namespace) -> int:
    from slurm_plugin.daemon.agent import run_agent
    overrides = {}
    if args.node:
        overrides["node"] = args.node
    if args.policy:
        overrides["policy"] = Policy(args.policy)
    config = load_agent_config(args.config, **overrides)
    setup_logging(f"agent[{config.node}]", args.log_level)
    return run_agent(config, once=args.once, metrics_port=args.metrics_port,
                     metrics_addr=args.metrics_address, metrics_retry_s=args.metrics_retry)


def _doctor_cmd(args: argparse.Namespace) -> int:
    from slurm_plugin.commands.doctor import Status, diagnose, gather, render
    overrides = {"node": args.node} if args.node else {}
    config = load_agent_config(args.config, **overrides)
    checks = diagnose(gather(config))
    print(render(checks))
    failed = [c.name for c in checks if c.status is Status.FAIL]
    if failed:
        raise CliError(f"node {config.node}: {len(failed)} check(s) failed: {', '.join(failed)}")
    return 0


def _watcher_cmd(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading

    from slurm_plugin.feed import ClusterWatcher, FeedStore, WatcherConfig
    from slurm_plugin.slurm import CliSlurmClient
    setup_logging("watcher", args.log_level)
    feed_dir, slurm_conf = args.feed_dir, args.slurm_conf
    if args.config:   # the nodes' agent.json says where the feed is (the systemd unit's way)
        agent = load_agent_config(args.config)
        feed_dir = feed_dir or agent.feed_dir
        slurm_conf = slurm_conf or agent.slurm_conf
    config = WatcherConfig(
        feed_dir=Path(feed_dir) if feed_dir else root_settings().feed_dir,
        slurm_conf=Path(slurm_conf) if slurm_conf else None, resync_s=args.resync)
    if config.slurm_conf is not None and not config.slurm_conf.is_file():
        raise CliError(f"no slurm.conf at {config.slurm_conf} (--slurm-conf)")
    client = CliSlurmClient(slurm_conf=config.slurm_conf)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # Jobs' borrowed cores go into Slurm's accounting where there is a database. The watcher
    # may start before slurmctld (a service started beside it, docker-slurm's controller): it
    # waits for it, saying so, except for --once.
    wait_s = 1.0
    while True:
        try:
            storage = client.accounting_storage()
            break
        except CommandError as exc:
            if args.once:
                raise CliError(f"cannot read slurmctld's config ({exc}): is slurmctld up, and "
                               "--slurm-conf (or SLURM_CONF) its slurm.conf?") from None
            logging.getLogger(__name__).warning(
                "slurmctld does not answer yet (%s): trying again in %g s", exc, wait_s)
            if stop.wait(wait_s):
                return 0
            wait_s = min(wait_s * 2, 30.0)
    accounting = client if storage == "accounting_storage/slurmdbd" else None
    logging.getLogger(__name__).info(
        "jobs' usage: %s", "sacct (SystemComment) and usage.jsonl" if accounting
        else f"usage.jsonl only (AccountingStorageType={storage})")
    watcher = ClusterWatcher(config, client, FeedStore(config.feed_dir), accounting=accounting)
    if args.once:
        watcher.store.prepare()
        result = watcher.poll()
        print(f"{result.jobs} jobs, published {len(result.nodes_written)} node(s)")
        if result.error:
            raise CliError(f"the poll failed: {result.error}")
        return 0
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
    return 0


def _containers_cmd(args: argparse.Namespace) -> int:
    import signal
    import socket
    import threading

    from malleable_protocol import format_cpu_list, parse_cpu_list
    from slurm_plugin.containers import ContainerCoScheduler, DockerCli
    from malleable_policy.model import Policy
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


def _install_hooks_cmd(args: argparse.Namespace) -> int:
    from slurm_plugin.node.config import AgentConfig
    from slurm_plugin.hooks.install import install
    from malleable_policy.model import Policy
    config = AgentConfig(node="(set by SLURMD_NODENAME or --node)", policy=Policy(args.policy),
                         run_dir=Path(args.run_dir), state_dir=Path(args.state_dir),
                         feed_dir=Path(args.feed_dir), max_cpus=args.max_cpus,
                         slurm_conf=Path(args.slurm_conf) if args.slurm_conf else None)
    spank_library = Path(args.spank_plugin) if args.spank_plugin else None
    try:
        paths = install(Path(args.dir), config, spank_library=spank_library)
    except SpankBuildError as exc:
        raise CliError(str(exc)) from None
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _resize_cmd(args: argparse.Namespace) -> int:
    from malleable_policy.request import parse_update
    text = f"malleable:cpus={args.cpus}"
    parse_update(text)   # the same check Slurm's job_submit.lua makes
    try:
        _client(args).set_comment(args.job_id, text)
    except UnknownJob:
        raise CliError(f"no job {args.job_id} in Slurm (squeue shows the running ones)") from None
    print(f"job {args.job_id}: asked for {args.cpus} cores per node")
    return 0


def _cgroups_cmd(args: argparse.Namespace) -> int:
    """The node's Slurm cgroup layout as discovered; with --job, that job's CPUs."""
    from slurm_plugin.cgroups import discover_layout
    from slurm_plugin.node.cgroup_actuator import read_cpus
    from malleable_protocol import format_cpu_list
    node = args.node or root_settings().node
    if not node:
        raise CliError("which node? --node NAME (or run it inside a job)")
    layout = discover_layout(node, slurm_conf=args.slurm_conf)
    if args.job is None:
        print(layout.describe())
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


def _client(args: argparse.Namespace):
    """A local cluster's client (its whole environment reaches the jobs), or Slurm's own."""
    from slurm_plugin.slurm import CliSlurmClient
    if getattr(args, "dir", None):
        return LocalCluster.load(Path(args.dir)).client()
    return CliSlurmClient()


def _status_cmd(args: argparse.Namespace, *, uid: int | None = None) -> int:
    """Root sees every job and each node's problems; anyone else (PrivateData=jobs) only his
    own jobs, and only where the feed is readable to him. Exit 1 with what to do when there is
    no status to show: no feed folder, a feed no node was published into yet, a feed this user
    may not read, a job (``job_id``) not in it; also when a node reports a problem."""
    from slurm_plugin.commands.status import (FeedUnreadable, check_feed, collect_problems,
                                     collect_status, format_table)
    from slurm_plugin.feed import FeedStore
    uid = os.geteuid() if uid is None else uid
    store = FeedStore(Path(args.feed_dir))
    try:
        check_feed(store)
    except FeedUnreadable as exc:
        raise CliError(str(exc)) from None
    job_id = getattr(args, "job_id", None)
    state_dir = Path(getattr(args, "state_dir", None) or Path(args.feed_dir).parent / "agent")
    rows = collect_status(store, only_malleable=not args.all and job_id is None,
                          uid=None if uid == 0 else uid, state_dir=state_dir)
    problems = collect_problems(store) if uid == 0 else []
    if job_id is not None:
        rows = [r for r in rows if r.job_id == job_id]
        if not rows:
            raise CliError(f"no job {job_id} in the feed at {store.feed_dir}: not running (or "
                           "not started yet), not seen by the watcher yet"
                           + ("" if uid == 0 else ", or not yours") + "; squeue shows the jobs")
        nodes = {r.node for r in rows}
        problems = [p for p in problems if p.split(":", 1)[0][len("node "):] in nodes]
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        print(format_table(rows))
    for line in problems:     # also with --json: on stderr, and the exit code says so
        print(f"PROBLEM {line}", file=sys.stderr if args.json else sys.stdout)
    return 1 if problems else 0


def _sbatch_cmd(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    from sbatch_templates import parse_sets, render
    values = parse_sets(args.set)
    # This installation's interpreter and launcher, unless the user names others.
    values.setdefault("python", sys.executable)
    values.setdefault("launcher", shutil.which("malleable-srun") or
                      str(Path(sys.executable).with_name("malleable-srun")))
    script = render(args.template, values)
    if args.dry_run:
        print(script, end="")
        return 0
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch", delete=False) as f:
        f.write(script)
    try:
        job_id = _client(args).submit(Path(f.name))
    except BaseException:
        os.unlink(f.name)     # nothing was submitted: no script is left behind
        raise
    print(f"submitted job {job_id} ({args.template}, script {f.name})")
    return 0


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
    return port


def _ip_address(text: str) -> str:
    """An address to bind (IPv4 or IPv6, no host name: what is served where is not left to a
    resolver)."""
    import ipaddress
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an IP address: {text!r} (127.0.0.1 this node only, 0.0.0.0 every interface, "
            "or one of the node's own addresses; no host names)") from None


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


DISTRIBUTION = "malleable-hpc"     # the checkout's (pyproject.toml)
# Where it may be installed from: pip (the whole project), the Debian package (node side).
DISTRIBUTIONS = (DISTRIBUTION, "malleable-slurm")


def package_version() -> str:
    """The installed distribution's version (pip's, or the Debian package's dist-info); in a
    checkout run without installing, the version pyproject.toml beside the package says; else
    "unknown"."""
    from importlib.metadata import PackageNotFoundError, version
    for distribution in DISTRIBUTIONS:
        try:
            return version(distribution)
        except PackageNotFoundError:
            pass
    try:
        import tomllib
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        project = tomllib.loads(pyproject.read_text())["project"]
        if project.get("name", "").replace("_", "-") == DISTRIBUTION:
            return str(project["version"])
    except (ImportError, OSError, ValueError, KeyError, TypeError):
        pass
    return "unknown"


class _VersionAction(argparse.Action):
    """``--version``: the version is looked up only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print the version and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {package_version()}")
        parser.exit(0)


def _job_id(text: str) -> int:
    try:
        job_id = int(text)
    except ValueError:
        job_id = 0
    if job_id <= 0:
        raise argparse.ArgumentTypeError(f"not a Slurm job id: {text!r}")
    return job_id


def build_parser() -> argparse.ArgumentParser:
    env = root_settings()     # the defaults some options take from the environment
    parser = argparse.ArgumentParser(prog="malleable", description=__doc__)
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    cl = sub.add_parser("cluster", help="the local Slurm mini-cluster")
    cl.add_argument("action", choices=["up", "down", "status", "env"])
    cl.add_argument("--dir", default=str(DEFAULT_ROOT),
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
    cl.set_defaults(func=_cluster_cmd)

    ag = sub.add_parser("agent", help="the per-node co-scheduler (foreground)")
    ag.add_argument("--config", required=True, help="agent.json (from install-slurm-hooks)")
    ag.add_argument("--node", help="this node's Slurm name (default: from the config)")
    ag.add_argument("--policy", choices=POLICIES)
    ag.add_argument("--once", action="store_true", help="one reconcile cycle, then exit")
    ag.add_argument("--metrics-port", type=_port,
                    help="serve Prometheus metrics on ADDR:PORT (a port below 1024: no job "
                         "user can take it first; if it is taken, the agent runs on and "
                         "retries)")
    ag.add_argument("--metrics-address", "--metrics-addr", dest="metrics_address",
                    type=_ip_address, default="127.0.0.1", metavar="ADDR",
                    help="the IP address the metrics are served on (default %(default)s: this "
                         "node only; 0.0.0.0, or the node's own address, for a central "
                         "Prometheus)")
    ag.add_argument("--metrics-retry", type=_positive_seconds, default=5.0, metavar="SECONDS",
                    help="seconds between attempts to bind a taken metrics port "
                         "(default %(default)s)")
    add_log_level_option(ag)
    ag.set_defaults(func=_agent_cmd)

    co = sub.add_parser("containers", help="the co-scheduler for Docker containers labelled "
                        "malleable=min=N,max=N|node,weight=N on this host (foreground)")
    co.add_argument("--policy", default="lend-idle", choices=POLICIES)
    co.add_argument("--cpus", help="the host's CPUs it hands out (default: its own affinity)")
    co.add_argument("--state-dir", default="/run/malleable/containers",
                    help="root-only folder of its admissions (default %(default)s)")
    co.add_argument("--interval", type=_positive_seconds, default=0.5,
                    help="seconds between cycles")
    co.add_argument("--once", action="store_true", help="one cycle, then exit")
    add_log_level_option(co)
    co.set_defaults(func=_containers_cmd)

    dr = sub.add_parser("doctor", help="check this node's co-scheduler install (root): Slurm's "
                        "hooks, the SPANK plugin, the cgroup layout, the agent, the feed")
    dr.add_argument("--config", required=True, help="agent.json (from install-slurm-hooks)")
    dr.add_argument("--node", help="the node (default: agent.json's, or SLURMD_NODENAME)")
    dr.set_defaults(func=_doctor_cmd)

    wa = sub.add_parser("watcher", help="the cluster's one reader of slurmctld (foreground)")
    wa.add_argument("--config", help="agent.json: the feed folder and slurm.conf from it")
    wa.add_argument("--feed-dir", help="the feed folder (default: --config's, else "
                                       "$MALLEABLE_FEED_DIR, else /run/malleable/feed)")
    wa.add_argument("--slurm-conf", help="Slurm's configuration (default: Slurm's own)")
    wa.add_argument("--resync", type=_positive_seconds, default=10.0,
                    help="seconds between polls when no event came (default %(default)s)")
    wa.add_argument("--once", action="store_true", help="one poll, then exit")
    wa.add_argument("--metrics-port", type=_port,
                    help="serve the watcher's Prometheus metrics on this port")
    wa.add_argument("--metrics-address", type=_ip_address, default="127.0.0.1",
                    help="address of the metrics port (default %(default)s)")
    add_log_level_option(wa)
    wa.set_defaults(func=_watcher_cmd)

    ih = sub.add_parser("install-slurm-hooks",
                        help="render job_submit.lua, Prolog, Epilog, PrologSlurmctld")
    ih.add_argument("dir")
    ih.add_argument("--policy", default="lend-idle", choices=POLICIES)
    ih.add_argument("--run-dir", default="/run/malleable", help="the protocol's folders")
    ih.add_argument("--state-dir", default="/run/malleable/agent")
    ih.add_argument("--feed-dir", default="/run/malleable/feed",
                    help="a folder the watcher and every node agent share")
    ih.add_argument("--max-cpus", type=int, default=None,
                    help="site limit on a job's cores per node (min=, max=, cpus=; max=node too)")
    ih.add_argument("--slurm-conf", help="slurm.conf, where not Slurm's default")
    ih.add_argument("--spank-plugin", metavar="PATH",
                    help="a built malleable_spank.so (the Debian package's: "
                         "/usr/lib/malleable/malleable_spank.so); default: build it into DIR")
    ih.set_defaults(func=_install_hooks_cmd)

    rs = sub.add_parser("resize", help="ask for CPUS cores per node for a malleable job")
    rs.add_argument("job_id", type=_job_id)
    rs.add_argument("cpus", type=int)
    rs.add_argument("--dir", help="a local cluster's folder (else Slurm's own configuration)")
    rs.set_defaults(func=_resize_cmd)

    sb = sub.add_parser("sbatch", help="render a batch template and submit it")
    sb.add_argument("template", help="single-node, multi-node, multi-worker or coschedule")
    sb.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sb.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    sb.add_argument("--dir", help="a local cluster's folder (else Slurm's own configuration)")
    sb.set_defaults(func=_sbatch_cmd)

    st = sub.add_parser("status", help="malleable jobs: cores and threads per node (root: "
                        "every user's; the feed is root's, like PrivateData=jobs)")
    st.add_argument("job_id", nargs="?", type=_job_id,
                    help="only this job (rigid or malleable); exit 1 if it is not in the feed")
    st.add_argument("--feed-dir", default=str(env.feed_dir))
    st.add_argument("--state-dir", default=env.state_dir and str(env.state_dir),
                    help="the node agents' state folder, for the core-seconds each job borrowed "
                    "and lent (default: the feed folder's sibling 'agent'; only this node's "
                    "ledger is there on a real cluster)")
    st.add_argument("--all", action="store_true", help="rigid jobs too")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_status_cmd)

    cg = sub.add_parser("cgroups", help="this node's Slurm cgroup layout (discovered), or a "
                        "job's CPUs")
    cg.add_argument("--node", help="the Slurm node name (default: $SLURMD_NODENAME or "
                    "$SLURM_NODENAME)")
    cg.add_argument("--slurm-conf", help="slurm.conf (cgroup.conf beside it); default "
                    "$SLURM_CONF")
    cg.add_argument("--job", type=int, help="print this job's CPUs on the node")
    cg.add_argument("--uid", type=int, default=os.getuid(), help="the job's owner (v1 paths)")
    cg.add_argument("--step", help="a step folder (step_0, step_batch) instead of the job's")
    cg.set_defaults(func=_cgroups_cmd)

    return parser


def error_text(exc: BaseException) -> str:
    """An error's message for a person: an OS error as "path: reason"."""
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, CliError):
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        return f"{where}: {exc.strerror}" if where else exc.strerror
    return str(exc).strip() or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """0 done, 1 could not be done (one line on stderr: ``malleable <command>: ...``), 2 a usage
    error (argparse's own exit)."""
    try:
        parser = build_parser()
    except FixableError as exc:     # a bad variable of the environment
        print(f"malleable: {exc}", file=sys.stderr, flush=True)
        return 1
    args = parser.parse_args(argv)
    try:
        try:
            return args.func(args)
        except OSError as exc:
            # A path the world refused (missing, no permission, full disk) is the user's or
            # admin's to fix; an OSError without one is a bug like any other.
            if exc.filename is None:
                raise
            raise CliError(f"{exc.filename}: {exc.strerror or exc}") from exc
    except RUNTIME_ERRORS as exc:
        # One line says what was wrong; what an error carries beyond it (daemons' log tails)
        # follows, indented.
        first, *rest = error_text(exc).splitlines() or [type(exc).__name__]
        print(f"malleable {args.command}: {first}", file=sys.stderr, flush=True)
        for line in rest:
            print(f"  {line}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
