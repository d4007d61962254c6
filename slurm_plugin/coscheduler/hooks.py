"""Prolog and Epilog entry points, and the installer of the Slurm hooks.

A Prolog must never fail a job for a reason of ours (Slurm would drain the node): errors are
logged to the event folder and the Prolog exits 0; the agent's next cycle repairs what is left.
"""
from __future__ import annotations

import argparse
import os
import signal
import string
import sys
import time
from importlib import resources
from pathlib import Path

from ..slurm import CliSlurmClient
from ..cgroups import detect_version
from .cgroup_actuator import CpusetActuator, SlurmCgroupLayout
from .config import AgentConfig
from .reconciler import Reconciler


def _template(name: str) -> string.Template:
    return string.Template(resources.files("slurm_plugin").joinpath("templates", name).read_text())


def install(dest: Path, config: AgentConfig, *, max_value: int = 4096,
            python: str = sys.executable) -> dict[str, Path]:
    """Render job_submit.lua, prolog.sh, epilog.sh and agent.json into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    paths = {name: dest / name for name in ("job_submit.lua", "prolog.sh", "epilog.sh", "agent.json")}
    paths["agent.json"].write_text(config.to_json())
    paths["job_submit.lua"].write_text(_template("job_submit.lua.tmpl").substitute(max_value=max_value))
    for hook in ("prolog.sh", "epilog.sh"):
        paths[hook].write_text(_template(f"{hook}.tmpl").substitute(
            python=python, config=paths["agent.json"]))
        paths[hook].chmod(0o755)
    return paths


def load_config(path: Path) -> AgentConfig:
    node = os.environ.get("SLURMD_NODENAME")
    overrides = {"node": node} if node else {}
    return AgentConfig.from_json(path.read_text(), **overrides)


def make_reconciler(config: AgentConfig) -> Reconciler:
    layout = SlurmCgroupLayout(config.node, detect_version(config.cgroup_mount), config.cgroup_mount)
    return Reconciler(config, CliSlurmClient(slurm_conf=config.slurm_conf), CpusetActuator(layout))


def _note(config: AgentConfig, text: str) -> None:
    try:
        config.state_dir.mkdir(parents=True, exist_ok=True)
        with open(config.state_dir / f"hooks-{config.node}.log", "a") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")
    except OSError:
        pass


def prolog(config: AgentConfig) -> int:
    t0 = time.monotonic()
    result = make_reconciler(config).cycle(lock_timeout_s=10)
    job = os.environ.get("SLURM_JOB_ID", "?")
    _note(config, f"prolog job {job}: {len(result.changes)} changes in "
                  f"{(time.monotonic() - t0) * 1000:.0f} ms" +
          (f"; errors: {result.errors}" if result.errors else ""))
    return 0


def epilog(config: AgentConfig) -> int:
    try:
        pid = int(config.pid_file.read_text())
        os.kill(pid, signal.SIGUSR1)
    except (OSError, ValueError):
        pass   # no agent: its next start lends the cores
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="malleable-hook")
    ap.add_argument("which", choices=["prolog", "epilog"])
    ap.add_argument("--config", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        config = load_config(args.config)
    except Exception as exc:  # noqa: BLE001 - never fail the job
        print(f"malleable {args.which}: bad config {args.config}: {exc}", file=sys.stderr)
        return 0
    try:
        return prolog(config) if args.which == "prolog" else epilog(config)
    except Exception as exc:  # noqa: BLE001 - never fail the job; the agent repairs
        _note(config, f"{args.which} failed: {exc!r}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
