"""Finding and removing the cgroup folders that Slurm's task/cgroup creates for a node.

The co-scheduler's cpuset actuators build on the same paths (see FACTS: cgroup v1 here).
"""
from __future__ import annotations

import enum
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DEFAULT_MOUNT = Path("/sys/fs/cgroup")


class CgroupVersion(enum.Enum):
    V1 = "v1"
    V2 = "v2"


def detect_version(mount: Path = DEFAULT_MOUNT) -> CgroupVersion:
    """v1 when a separate cpuset hierarchy is mounted (also on hybrid hosts), else v2."""
    if (mount / "cpuset" / "cpuset.cpus").exists():
        return CgroupVersion.V1
    if (mount / "cgroup.controllers").exists():
        return CgroupVersion.V2
    raise RuntimeError(f"no cgroup v1 cpuset nor cgroup v2 hierarchy under {mount}")


def node_cgroup_roots(node: str, mount: Path = DEFAULT_MOUNT) -> list[Path]:
    """The existing top folders a (multiple-)slurmd named ``node`` made, one per hierarchy."""
    found = sorted(p for p in mount.glob(f"*/slurm_{node}") if p.is_dir())
    # cgroup v2 (not seen on these machines): slurmd makes a systemd scope per node.
    found += sorted(p for p in mount.glob(f"system.slice/{node}_slurmstepd.scope") if p.is_dir())
    return found


@dataclass
class RemovalReport:
    removed: list[Path]
    killed_pids: list[int]
    failed: list[tuple[Path, str]]


def _read_pids(folder: Path) -> list[int]:
    try:
        text = (folder / "cgroup.procs").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def remove_cgroup_tree(root: Path, *, timeout_s: float = 10.0,
                       sleep: Callable[[float], None] = time.sleep) -> RemovalReport:
    """Kill what still runs in ``root`` and below, then remove the folders bottom-up."""
    report = RemovalReport(removed=[], killed_pids=[], failed=[])
    if not root.is_dir():
        return report
    folders = sorted((Path(d) for d, _, _ in os.walk(root)), key=lambda p: len(p.parts), reverse=True)
    for folder in folders:
        freezer_state = folder / "freezer.state"
        if freezer_state.exists():
            try:
                freezer_state.write_text("THAWED")  # a frozen task cannot die
            except OSError:
                pass
        for pid in _read_pids(folder):
            try:
                os.kill(pid, signal.SIGKILL)
                report.killed_pids.append(pid)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout_s
    for folder in folders:
        while True:
            try:
                folder.rmdir()
                report.removed.append(folder)
                break
            except FileNotFoundError:
                break
            except OSError as exc:  # busy: killed tasks not reaped yet
                if time.monotonic() > deadline:
                    report.failed.append((folder, str(exc)))
                    break
                for pid in _read_pids(folder):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                sleep(0.05)
    return report
