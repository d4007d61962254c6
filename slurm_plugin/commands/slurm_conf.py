"""``malleable slurm-conf``: what the site's slurm.conf needs for malleable, against the
configuration slurmctld runs with (``scontrol show config``); with ``--write-include``, the
lines to add written to ``malleable.conf`` beside slurm.conf, for the admin to ``Include``.
It never edits slurm.conf (``hooks.slurm_conf`` says why each key is in the state it is)."""
from __future__ import annotations

import argparse
from pathlib import Path

from malleable_protocol.runner import CommandError, CommandRunner, run_command
from malleable_protocol.safe_io import write_atomic

from slurm_plugin.commands.common import DEFAULT_AGENT_CONFIG, CliError
from slurm_plugin.hooks.slurm_conf import Wanted, plan, render
from slurm_plugin.settings import CONFIGLESS_SLURM_CONF, RootSettings, local_slurm_conf
from slurm_plugin.slurm.parsers import parse_config_value


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    sc = sub.add_parser("slurm-conf", help="what slurm.conf needs for malleable, checked against "
                        "slurmctld's configuration (Include files, the release's rules); it "
                        "never edits slurm.conf (admin, on the controller)")
    sc.add_argument("--slurm-etc", type=Path,
                    help="the folder of the controller's slurm.conf, where prolog.d/, epilog.d/ "
                         "and malleable.conf are (default: that of the slurm.conf this host "
                         "reads)")
    sc.add_argument("--malleable-etc", type=Path, default=Path(DEFAULT_AGENT_CONFIG).parent,
                    help="where install-slurm-hooks rendered the hooks (default %(default)s)")
    sc.add_argument("--write-include", action="store_true",
                    help="write the lines to add to SLURM_ETC/malleable.conf (root's, 0644) for "
                         "an 'Include malleable.conf' line; slurm.conf itself is not touched")
    sc.set_defaults(func=run)


def run(args: argparse.Namespace, *, runner: CommandRunner = run_command) -> int:
    """0: nothing needs the admin's hand beyond merging the lines shown (or none); 1: a key
    the site set must be chained by hand, as said."""
    try:
        text = runner(["scontrol", "show", "config"], timeout=20).stdout
    except CommandError as exc:
        raise CliError(f"scontrol show config failed ({exc}): slurm-conf checks against the "
                       "running slurmctld's configuration; is it up?") from None
    local = local_slurm_conf(None, parse_config_value(text, "SLURM_CONF"))
    slurm_etc = args.slurm_etc or local.parent
    p = plan(text, Wanted.of(slurm_etc, args.malleable_etc))
    if args.write_include and p.to_add:
        if local == CONFIGLESS_SLURM_CONF and args.slurm_etc is None:
            raise CliError(f"this host reads a configless copy of slurm.conf ({local}): run "
                           "slurm-conf --write-include on the controller, beside its slurm.conf")
        _write_root_file(p.include_file, p.include_text())
    print(render(p, written=args.write_include and bool(p.to_add)))
    if p.needs_hand:
        raise CliError(f"{len(p.needs_hand)} key(s) the site set need a hand: "
                       f"{', '.join(k.key for k in p.needs_hand)} (see above)")
    return 0


def _write_root_file(path: Path, text: str) -> None:
    """Replaced whole (slurmctld never reads half of it), in a folder only root writes."""
    header = ("# malleable (docs/install.md): written by `malleable slurm-conf --write-include`; "
              "slurm.conf Includes it\n")
    try:
        write_atomic(path.parent, path.name, (header + text).encode(), 0o644)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
