"""``malleable-sbatch TEMPLATE [--set KEY=VALUE ...] [--dry-run] [-- SBATCH_OPTION ...]``: a
template rendered and handed to sbatch, from the user wheel (a login node has no node package).
The node package's ``malleable sbatch`` is the same command (plus ``--dir``, a local cluster's
folder): both take their arguments and their script from here.

Options after ``--`` go to sbatch's command line, where they win over the template's ``#SBATCH``
lines (``-- --account=ml --partition=cpu --mem=8G --gres=gpu:1 --time=2:00:00``): a template
never stands between a user and a site's required options. sbatch's own output and exit code
are the command's: it reads the script before it returns, so the script is removed then.

Exit codes: sbatch's; 1 a template that cannot be rendered or no sbatch here; 2 a wrong
command line."""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from sbatch_templates import TEMPLATES, TemplateError, parse_sets, render

PASSTHROUGH_HELP = ("After --: options for sbatch itself (--account, --partition, --mem, --gres, "
                    "--time, ...), which win over the template's #SBATCH lines.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The template, its values and --dry-run: the arguments of both commands."""
    parser.add_argument("template", help=" or ".join(sorted(TEMPLATES)))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a template parameter (program=train.py, nodes=2, max_cpus=8, ...)")
    parser.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")


def script_for(template: str, sets: Sequence[str]) -> str:
    """The batch script: the template with the user's values, and by default this
    installation's interpreter and launcher."""
    values = parse_sets(list(sets))
    values.setdefault("python", sys.executable)
    values.setdefault("launcher", shutil.which("malleable-srun") or
                      str(Path(sys.executable).with_name("malleable-srun")))
    return render(template, values)


def dry_run_text(script: str, options: Sequence[str]) -> str:
    head = f"# sbatch {shlex.join(options)} SCRIPT\n" if options else ""
    return head + script


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The command's own arguments and, after the first ``--``, sbatch's (untouched)."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def main(argv: Sequence[str] | None = None,
         run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> int:
    parser = argparse.ArgumentParser(
        prog="malleable-sbatch", epilog=PASSTHROUGH_HELP,
        usage="malleable-sbatch TEMPLATE [--set KEY=VALUE ...] [--dry-run] [-- SBATCH_OPTION ...]",
        description="Render a malleable job's batch template and submit it with sbatch.")
    add_arguments(parser)
    own, options = split_passthrough(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    try:
        script = script_for(args.template, args.set)
    except TemplateError as exc:
        print(f"malleable-sbatch: {exc}", file=sys.stderr)
        return 1
    if args.dry_run:
        print(dry_run_text(script, options), end="")
        return 0
    fd, path = tempfile.mkstemp(prefix=f"malleable-{args.template}-", suffix=".sbatch")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(script)
        try:
            return run(["sbatch", *options, path]).returncode
        except FileNotFoundError:
            print("malleable-sbatch: no sbatch on PATH: run it where Slurm's commands are "
                  "(a login node)", file=sys.stderr)
            return 1
    finally:
        os.unlink(path)


if __name__ == "__main__":
    sys.exit(main())
