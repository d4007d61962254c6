"""Rewrites the cpusets of a Slurm job's cgroup folders, in an order the kernel accepts.

cgroup v1 (verified here): a parent cannot drop CPUs a child still uses ("Device or resource
busy"), so every folder is first widened top-down (job folder, then steps) and then narrowed
bottom-up. cgroup v2 needs no order, and the same code path serves it (tested on a fake tree).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..cgroups import CgroupVersion
from ..cpulist import format_cpu_list, parse_cpu_list

CPUS_FILE = "cpuset.cpus"


class ActuatorError(RuntimeError):
    pass


def _check_id(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
        raise ValueError(f"invalid {name} {value!r}")
    return value


@dataclass(frozen=True)
class SlurmCgroupLayout:
    """Where slurmd (22.05, task/cgroup) puts a node's job folders."""

    node: str
    version: CgroupVersion = CgroupVersion.V1
    mount: Path = Path("/sys/fs/cgroup")

    def node_dir(self) -> Path:
        if "/" in self.node or self.node in ("", ".", ".."):
            raise ValueError(f"invalid node name {self.node!r}")
        if self.version is CgroupVersion.V1:
            return self.mount / "cpuset" / f"slurm_{self.node}"
        return self.mount / "system.slice" / f"{self.node}_slurmstepd.scope"

    def job_dir(self, uid: int, job_id: int) -> Path:
        _check_id("uid", uid)
        _check_id("job id", job_id)
        if self.version is CgroupVersion.V1:
            return self.node_dir() / f"uid_{uid}" / f"job_{job_id}"
        return self.node_dir() / f"job_{job_id}"


def read_cpus(folder: Path | str) -> frozenset[int] | None:
    # Raw reads on string paths: the agent reads every job's folders every cycle.
    try:
        fd = os.open(os.path.join(folder, CPUS_FILE), os.O_RDONLY)
    except OSError:
        return None
    try:
        return parse_cpu_list(os.read(fd, 65536).decode())
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _descendants(folder: Path) -> list[str]:
    """Sub-folders (steps, tasks), parents before children; links are never followed."""
    out = []
    for root, dirs, _ in os.walk(folder, followlinks=False):
        dirs.sort()
        out += [os.path.join(root, d) for d in dirs]
    return out


class CpusetActuator:
    def __init__(self, layout: SlurmCgroupLayout):
        self.layout = layout

    def current(self, uid: int, job_id: int) -> frozenset[int] | None:
        """The job folder's CPUs, or None when the folder does not exist (yet)."""
        return read_cpus(self.layout.job_dir(uid, job_id))

    def apply(self, uid: int, job_id: int, cpus: frozenset[int],
              allocation: frozenset[int] | None = None) -> None:
        """Give the job ``cpus``. The batch and extern steps stay within Slurm's ``allocation``:
        they run no compute, and slurmstepd resets the job folder to the allocation whenever a
        new step starts, which the kernel refuses (EBUSY: the step then fails to launch) while
        any child holds more. Seen here with Slurm 22.05."""
        if not cpus:
            raise ValueError("a job cannot be left without CPUs")
        job_dir = self.layout.job_dir(uid, job_id)
        if not job_dir.is_dir():
            raise ActuatorError(f"no cgroup folder {job_dir}")
        top = str(job_dir)
        folders = [top] + _descendants(job_dir)
        desired = {}
        for f in folders:
            step = f[len(top) + 1:].split("/", 1)[0]
            quiet = step in ("step_batch", "step_extern")
            desired[f] = (cpus & allocation) or cpus if quiet and allocation else cpus
        old = {f: read_cpus(f) or frozenset() for f in folders}
        # The uid folder must hold every CPU its jobs hold (v1 parents bound children).
        parent_cpus = read_cpus(job_dir.parent)
        if parent_cpus is not None and not cpus <= parent_cpus:
            self._write(job_dir.parent, parent_cpus | cpus)
        # Top-down, widen each folder to old | new; then bottom-up, narrow it to new. Parents
        # always hold their children's CPUs, in cgroup v1's order, whatever moves where.
        now = dict(old)
        for f in folders:
            if old[f] | desired[f] != old[f]:
                self._write(f, old[f] | desired[f])
                now[f] = old[f] | desired[f]
        for f in reversed(folders):
            if now[f] != desired[f]:
                self._write(f, desired[f])

    @staticmethod
    def _write(folder: Path | str, cpus: frozenset[int]) -> None:
        try:
            with open(os.path.join(folder, CPUS_FILE), "w") as f:
                f.write(format_cpu_list(cpus))
        except FileNotFoundError:
            return  # a step that just ended
        except OSError as exc:
            raise ActuatorError(f"writing {format_cpu_list(cpus)} to {folder}: {exc}") from exc
