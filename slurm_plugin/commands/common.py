"""What the ``malleable`` commands share: the error a command raises when it cannot do what it
was asked, the types of their arguments, the Slurm client they ask, and their log line."""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

from malleable_policy.model import Policy
from malleable_protocol.errors import FixableError
from slurm_plugin.slurm import CliSlurmClient

POLICIES = [p.value for p in Policy]
# Where docs/install.md's step configure puts agent.json: the admin's commands default to it.
DEFAULT_AGENT_CONFIG = "/etc/malleable/agent.json"


class CliError(FixableError):
    """A command cannot do what it was asked; the message says what was wrong and what to do
    (exit 1)."""


def say(msg: str) -> None:
    print(f"[malleable] {msg}", file=sys.stderr, flush=True)


def client(args: argparse.Namespace) -> CliSlurmClient:
    """A local cluster's client (its whole environment reaches the jobs), or Slurm's own."""
    if getattr(args, "dir", None):
        return development_cluster().LocalCluster.load(Path(args.dir)).client()
    return CliSlurmClient()


def development_cluster() -> ModuleType:
    """``slurm_plugin.cluster``, the local development cluster, imported only by the commands that
    use it; where it cannot be (without psutil, its 'cluster' extra), they say so."""
    try:
        return importlib.import_module("slurm_plugin.cluster")
    except ModuleNotFoundError as exc:
        if exc.name not in ("slurm_plugin.cluster", "psutil"):
            raise
        raise CliError(f"the local development cluster cannot be loaded here ({exc}): it needs "
                       "the project's 'cluster' extra (pip install 'malleable-hpc[cluster]')"
                       ) from None


def port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
    return port


def ip_address(text: str) -> str:
    """An address to bind (IPv4 or IPv6, no host name: what is served where is not left to a
    resolver)."""
    import ipaddress
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an IP address: {text!r} (127.0.0.1 this node only, 0.0.0.0 every interface, "
            "or one of the node's own addresses; no host names)") from None


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


def job_ids_arg(text: str) -> list[int]:
    """squeue -j's list: "12,13"."""
    return [job_id_arg(part) for part in text.split(",") if part.strip()] or [job_id_arg(text)]


def users_arg(text: str) -> list[int]:
    """squeue -u's list of user names or uids, as uids."""
    import pwd
    uids = []
    for name in (part.strip() for part in text.split(",")):
        if name.isdigit() and name.isascii() and len(name) <= 10:
            uids.append(int(name))
            continue
        try:
            uids.append(pwd.getpwnam(name).pw_uid)
        except (KeyError, ValueError):
            raise argparse.ArgumentTypeError(f"no user {name!r:.64}") from None
    return uids


def job_id_arg(text: str) -> int:
    try:
        job_id = int(text)
    except ValueError:
        job_id = 0
    if job_id <= 0:
        raise argparse.ArgumentTypeError(f"not a Slurm job id: {text!r}")
    return job_id
