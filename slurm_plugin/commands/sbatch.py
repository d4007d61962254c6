"""``malleable sbatch TEMPLATE [--set KEY=VALUE ...] [-- SBATCH_OPTIONS ...]``: render a batch
template and submit it. The user wheel's ``malleable-sbatch`` (``sbatch_templates.cli``) is the
same command; this one adds ``--dir`` (a local cluster's folder) and prints the job id and the
script it kept. Options after ``--`` go to sbatch's command line, where they win over the
template's ``#SBATCH`` lines."""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from sbatch_templates.cli import PASSTHROUGH_HELP, add_arguments, dry_run_text, script_for
from slurm_plugin.settings import RootSettings
from slurm_plugin.commands import common


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    sb = sub.add_parser("sbatch", help="render a batch template and submit it",
                        usage="malleable sbatch TEMPLATE [--set KEY=VALUE ...] [--dry-run] "
                              "[--dir DIR] [-- SBATCH_OPTION ...]",
                        epilog=PASSTHROUGH_HELP)
    add_arguments(sb)
    sb.add_argument("--dir", help="a local cluster's folder (else Slurm's own configuration)")
    # After "--" (main passes them on): options for sbatch itself, which win over the template's.
    sb.set_defaults(func=run, takes_passthrough=True)


def run(args: argparse.Namespace) -> int:
    script = script_for(args.template, args.set)
    options = list(args.passthrough)
    if args.dry_run:
        print(dry_run_text(script, options), end="")
        return 0
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch", delete=False) as f:
        f.write(script)
    try:
        job_id = common.client(args).submit(Path(f.name), options)
    except BaseException:
        os.unlink(f.name)     # nothing was submitted: no script is left behind
        raise
    print(f"submitted job {job_id} ({args.template}, script {f.name})")
    return 0
