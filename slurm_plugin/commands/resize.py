"""``malleable resize JOB CPUS``: ask for CPUS cores per node for a malleable job."""
from __future__ import annotations

import argparse

from slurm_plugin.settings import RootSettings
from slurm_plugin.slurm import UnknownJob
from slurm_plugin.commands import common
from slurm_plugin.commands.common import CliError, job_id_arg


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    rs = sub.add_parser("resize", help="ask for CPUS cores per node for a malleable job")
    rs.add_argument("job_id", type=job_id_arg)
    rs.add_argument("cpus", type=int)
    rs.add_argument("--dir", help="a local cluster's folder (else Slurm's own configuration)")
    rs.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    from malleable_policy.request import parse_update
    text = f"malleable:cpus={args.cpus}"
    parse_update(text)   # the same check Slurm's job_submit.lua makes
    try:
        common.client(args).set_comment(args.job_id, text)
    except UnknownJob:
        raise CliError(f"no job {args.job_id} in Slurm (squeue shows the running ones)") from None
    print(f"job {args.job_id}: asked for {args.cpus} cores per node")
    return 0
