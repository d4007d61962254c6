"""The ``malleable`` command.

Exit codes, the same for every subcommand: 0 done; 1 it could not be done (a missing feed
folder, an unknown job, no cluster, a Slurm command that failed, a bad config file...), said in
one line on stderr as ``malleable <command>: what was wrong, and what to do``; 2 the command
line itself is wrong (argparse's usage errors)."""
from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from malleable_protocol.errors import FixableError, error_text, is_fixable
from sbatch_templates.cli import split_passthrough
from slurm_plugin.commands import (agent, cgroups, cluster, containers, doctor,
                                   install_hooks, resize, sbatch, slurm_conf, status, switch,
                                   timeline, watcher)
from slurm_plugin.settings import root_settings

# One module per command, its parser beside its handler (``add_parser``, ``run``), in the order
# ``malleable --help`` lists them.
COMMANDS = (cluster, agent, containers, doctor, watcher, install_hooks, slurm_conf, resize,
            sbatch, status, timeline, cgroups, switch)


DISTRIBUTION = "malleable-hpc"     # the checkout's (pyproject.toml)
# Where it may be installed from: pip (the whole project), the Debian package (node side).
DISTRIBUTIONS = (DISTRIBUTION, "malleable-slurm")


def package_version() -> str:
    """The installed distribution's version (pip's, or the Debian package's dist-info); in a
    checkout run without installing, the version pyproject.toml beside the package says; else
    "unknown"."""
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


def build_parser() -> argparse.ArgumentParser:
    env = root_settings()     # the defaults some options take from the environment
    # Plain text for a terminal: the docstring's reStructuredText quotes dropped.
    parser = argparse.ArgumentParser(prog="malleable", description=__doc__.replace("``", ""))
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub, env)
    return parser


def main(argv: list[str] | None = None) -> int:
    """0 done, 1 could not be done (one line on stderr: ``malleable <command>: ...``), 2 a usage
    error (argparse's own exit)."""
    try:
        parser = build_parser()
    except FixableError as exc:     # a bad variable of the environment
        print(f"malleable: {exc}", file=sys.stderr, flush=True)
        return 1
    argv = list(sys.argv[1:] if argv is None else argv)
    # What follows "--" belongs to the program a command runs (malleable sbatch: sbatch's own
    # options), untouched by argparse; a command that runs none refuses it.
    argv, tail = split_passthrough(argv)
    args = parser.parse_args(argv)
    if tail and not getattr(args, "takes_passthrough", False):
        parser.error(f"malleable {args.command} takes no arguments after '--'")
    args.passthrough = tail
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not is_fixable(exc):
            raise
        # One line says what was wrong; what an error carries beyond it (daemons' log tails)
        # follows, indented.
        first, *rest = error_text(exc).splitlines() or [type(exc).__name__]
        print(f"malleable {args.command}: {first}", file=sys.stderr, flush=True)
        for line in rest:
            print(f"  {line}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
