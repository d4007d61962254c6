"""``malleable sbatch TEMPLATE [--set KEY=VALUE ...] [-- SBATCH_OPTIONS ...]``: render a batch
template and submit it. Options after ``--`` go to sbatch's command line, where they win over the
template's ``#SBATCH`` lines (``-- --account=ml --partition=cpu --mem=8G --gres=gpu:1
--time=2:00:00``): a template never stands between a user and a site's required options."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from slurm_plugin.settings import RootSettings
from slurm_plugin.commands import common


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    sb = sub.add_parser("sbatch", help="render a batch template and submit it",
                        usage="malleable sbatch TEMPLATE [--set KEY=VALUE ...] [--dry-run] "
                              "[--dir DIR] [-- SBATCH_OPTION ...]",
                        epilog="After --: options for sbatch itself (--account, --partition, "
                               "--mem, --gres, --time, ...), which win over the template's "
                               "#SBATCH lines.")
    sb.add_argument("template",
                    help="single-node, multi-node, multi-worker, pytorch-ddp or coschedule")
    sb.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sb.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    sb.add_argument("--dir", help="a local cluster's folder (else Slurm's own configuration)")
    # After "--" (main passes them on): options for sbatch itself, which win over the template's.
    sb.set_defaults(func=run, takes_passthrough=True)



def run(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    from sbatch_templates import parse_sets, render
    values = parse_sets(args.set)
    # This installation's interpreter and launcher, unless the user names others.
    values.setdefault("python", sys.executable)
    values.setdefault("launcher", shutil.which("malleable-srun") or
                      str(Path(sys.executable).with_name("malleable-srun")))
    script = render(args.template, values)
    options = list(args.passthrough)
    if args.dry_run:
        if options:
            print(f"# sbatch {shlex.join(options)} SCRIPT")
        print(script, end="")
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
