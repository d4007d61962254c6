"""``malleable sbatch TEMPLATE``: render a batch template and submit it."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from slurm_plugin.settings import RootSettings
from slurm_plugin.commands import common


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    sb = sub.add_parser("sbatch", help="render a batch template and submit it")
    sb.add_argument("template", help="single-node, multi-node, multi-worker or coschedule")
    sb.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sb.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    sb.add_argument("--dir", help="a local cluster's folder (else Slurm's own configuration)")
    sb.set_defaults(func=run)



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
    if args.dry_run:
        print(script, end="")
        return 0
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch", delete=False) as f:
        f.write(script)
    try:
        job_id = common.client(args).submit(Path(f.name))
    except BaseException:
        os.unlink(f.name)     # nothing was submitted: no script is left behind
        raise
    print(f"submitted job {job_id} ({args.template}, script {f.name})")
    return 0
