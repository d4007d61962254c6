"""``malleable install-slurm-hooks DIR``: render job_submit.lua, the Prolog, Epilog and
PrologSlurmctld, agent.json and the SPANK plugin's line."""
from __future__ import annotations

import argparse
from pathlib import Path

from malleable_policy.model import Policy
from slurm_plugin.settings import RootSettings
from slurm_plugin.hooks.spank import SpankBuildError
from slurm_plugin.commands.common import POLICIES, CliError, port


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    ih = sub.add_parser("install-slurm-hooks",
                        help="render job_submit.lua, Prolog, Epilog, PrologSlurmctld")
    ih.add_argument("dir")
    ih.add_argument("--policy", default="lend-idle", choices=POLICIES)
    ih.add_argument("--run-dir", default="/run/malleable", help="the protocol's folders")
    ih.add_argument("--state-dir", default="/run/malleable/agent")
    ih.add_argument("--feed-dir", default="/run/malleable/feed",
                    help="with --feed-link: each host's own copy of its feed (local); "
                         "without: a folder the watcher and every node agent share")
    ih.add_argument("--feed-link", metavar="HOST[,HOST...]",
                    help="the hosts whose watcher the agents connect to, in order (slurmctld's "
                         "SlurmctldHost list, primary first): the feed goes over the network, "
                         "no shared folder is needed")
    ih.add_argument("--feed-link-port", type=port, default=6826,
                    help="the watcher's TCP port for the feed link (default %(default)s)")
    ih.add_argument("--feed-link-auth", default="munge",
                    help="munge (default: the site's munged proves both ends are root) or "
                         "key:PATH (a key file only root reads, the same on every host)")
    ih.add_argument("--watcher-dir", default="/var/lib/malleable/watcher",
                    help="with --feed-link: the watcher's own folder on its host (the events "
                         "slurmctld's hooks append, the nodes' reports and usage)")
    ih.add_argument("--max-cpus", type=int, default=None,
                    help="site limit on a job's cores per node (min=, max=, cpus=; max=node too)")
    ih.add_argument("--slurm-conf", help="slurm.conf, where not Slurm's default")
    ih.add_argument("--spank-plugin", metavar="PATH",
                    help="a built malleable_spank.so (the Debian package's: "
                         "/usr/lib/malleable/malleable_spank.so); default: build it into DIR")
    ih.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    from slurm_plugin.node.config import AgentConfig
    from slurm_plugin.hooks.install import install
    hosts = tuple(h for h in (args.feed_link or "").split(",") if h)
    try:
        config = AgentConfig(node="(set by SLURMD_NODENAME or --node)",
                             policy=Policy(args.policy), run_dir=Path(args.run_dir),
                             state_dir=Path(args.state_dir), feed_dir=Path(args.feed_dir),
                             max_cpus=args.max_cpus,
                             slurm_conf=Path(args.slurm_conf) if args.slurm_conf else None,
                             feed_link_hosts=hosts, feed_link_port=args.feed_link_port,
                             feed_link_auth=args.feed_link_auth,
                             watcher_dir=Path(args.watcher_dir) if hosts else None)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    spank_library = Path(args.spank_plugin) if args.spank_plugin else None
    try:
        paths = install(Path(args.dir), config, spank_library=spank_library)
    except SpankBuildError as exc:
        raise CliError(str(exc)) from None
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0
