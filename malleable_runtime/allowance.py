"""How many cores this process may use, and which of them are this rank's share.

Pure functions over what the OS reports (an affinity mask, a cgroup CPU quota, the ranks on the
node), the small readers that fetch those inputs, and ``AllowanceFollower``, which tells an
outside restriction from the runtime's own pinning. The runtime polls them; tests drive the
pure parts directly.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from malleable_protocol import Target, parse_cpu_list, rank_share
from malleable_protocol.cgroupfs import parse_cgroup_mount_roots, parse_proc_cgroup


@dataclass(frozen=True)
class Allowance:
    """The CPUs this process may run on, and how many of them it may keep busy at once."""

    cpus: frozenset[int]
    quota_cpus: float | None = None  # from a CFS quota (docker --cpus, Kubernetes limits)

    @property
    def usable(self) -> int:
        n = len(self.cpus)
        if self.quota_cpus is not None:
            n = min(n, max(1, int(self.quota_cpus)))  # a fraction of a core rounds down
        return max(1, n)


def share_of(allowance: Allowance, local_rank: int, local_size: int) -> frozenset[int]:
    """This rank's CPUs when ``local_size`` ranks split the allowance (the protocol's split,
    which the agent uses too to tell each rank its thread target)."""
    return rank_share(allowance.cpus, local_rank, local_size, usable=allowance.usable)


# --- readers -------------------------------------------------------------------------------

def _below_root(path: str, root: str) -> str:
    """``path`` (from /proc/<pid>/cgroup) as seen below a mount of the folder ``root``."""
    if root in ("", "/") or not (path == root or path.startswith(root + "/")):
        return path
    return path[len(root):] or "/"


def parse_quota(v1_quota: str | None, v1_period: str | None, v2_max: str | None) -> float | None:
    """CPUs granted by a CFS quota, or None when unlimited. v2's cpu.max is "max 100000" or
    "150000 100000"; v1 has cpu.cfs_quota_us (-1 = unlimited) and cpu.cfs_period_us."""
    if v2_max is not None:
        m = re.match(r"^\s*(\S+)\s+(\d+)\s*$", v2_max)
        if not m or m[1] == "max":
            return None
        return int(m[1]) / int(m[2])
    if v1_quota is None or v1_period is None:
        return None
    q, p = int(v1_quota), int(v1_period)
    return None if q <= 0 or p <= 0 else q / p


def _safe_join(base: Path, rel: str) -> Path | None:
    # The path comes from /proc/<pid>/cgroup; refuse anything that leaves the mount.
    parts = [p for p in rel.split("/") if p]
    if any(p in (".", "..") for p in parts):
        return None
    return base.joinpath(*parts)


def _read(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


@dataclass(frozen=True)
class CgroupFiles:
    """Where this process's cpuset and CPU quota can be read, for one /proc/<pid>/cgroup."""

    cpuset: tuple[Path, ...] = ()
    quota_v1: tuple[Path, Path] | None = None
    quota_v2: Path | None = None

    @classmethod
    def locate(cls, proc_cgroup: str, mount: Path,
               mount_roots: dict[str, str] | None = None) -> "CgroupFiles":
        groups = parse_proc_cgroup(proc_cgroup)
        roots = mount_roots or {}
        cpuset: list[Path] = []
        if "cpuset" in groups and (base := _safe_join(
                mount / "cpuset", _below_root(groups["cpuset"], roots.get("cpuset", "/")))):
            cpuset.append(base / "cpuset.effective_cpus")
        unified = (_safe_join(mount, _below_root(groups[""], roots.get("", "/")))
                   if "" in groups else None)
        if unified is not None:
            cpuset.append(unified / "cpuset.cpus.effective")
        quota_v1 = None
        if "cpu" in groups:
            for sub in ("cpu,cpuacct", "cpu"):
                base = _safe_join(mount / sub, _below_root(groups["cpu"], roots.get(sub, "/")))
                if base is not None and (base / "cpu.cfs_quota_us").exists():
                    quota_v1 = (base / "cpu.cfs_quota_us", base / "cpu.cfs_period_us")
                    break
        quota_v2 = unified / "cpu.max" if unified is not None and "cpu" not in groups else None
        return cls(tuple(cpuset), quota_v1, quota_v2)


class CgroupReader:
    """Reads the cpuset and quota of a process cheaply. Reading /proc/<pid>/cgroup costs about
    0.1 ms, so where the files are is checked again at most every ``relocate_every_s`` (a
    process is rarely moved to another cgroup; Slurm never moves a running task)."""

    def __init__(self, mount: Path = Path("/sys/fs/cgroup"), pid: int | str = "self", *,
                 relocate_every_s: float = 1.0, clock=time.monotonic):
        self.mount = mount
        self.proc_cgroup = Path(f"/proc/{pid}/cgroup")
        self.proc_mountinfo = Path(f"/proc/{pid}/mountinfo")
        self.relocate_every_s = relocate_every_s
        self._clock = clock
        self._checked_at: float | None = None
        self._seen: str | None = None
        self._files = CgroupFiles()

    def invalidate(self) -> None:
        """Look up where the files are at the next read."""
        self._checked_at = None

    def files(self) -> CgroupFiles:
        now = self._clock()
        if self._checked_at is None or now - self._checked_at >= self.relocate_every_s:
            self._checked_at = now
            text = _read(self.proc_cgroup) or ""
            if text != self._seen:
                self._seen = text
                roots = parse_cgroup_mount_roots(_read(self.proc_mountinfo) or "", self.mount)
                self._files = CgroupFiles.locate(text, self.mount, roots)
        return self._files

    def watched_paths(self) -> tuple[Path, ...]:
        """The files whose change means the allowance may have changed: for a cheap poll."""
        f = self.files()
        return f.cpuset + (f.quota_v1 or ()) + ((f.quota_v2,) if f.quota_v2 else ())

    def cpuset(self) -> frozenset[int] | None:
        """The CPUs of the cpuset cgroup (v1 or v2), or None where none is readable."""
        for path in self.files().cpuset:
            text = _read(path)
            if text:
                try:
                    return parse_cpu_list(text)
                except ValueError:
                    return None
        return None

    def quota(self) -> float | None:
        f = self.files()
        if f.quota_v1 is not None:
            return parse_quota(_read(f.quota_v1[0]), _read(f.quota_v1[1]), None)
        if f.quota_v2 is not None:
            return parse_quota(None, None, _read(f.quota_v2))
        return None


def read_affinity(pid: int) -> frozenset[int]:
    return frozenset(os.sched_getaffinity(pid))


class AllowanceFollower:
    """The allowance as last read (``current``), and what is needed to read it again: which
    mask the runtime pinned itself to (``pinned``, set by whoever pins) and an affinity
    restriction set from outside (taskset), narrower than the cpuset."""

    def __init__(self, read_affinity: Callable[[], frozenset[int]], cgroup: CgroupReader, *,
                 mask_restricts: bool = True):
        self._read_affinity = read_affinity
        self.cgroup = cgroup
        # Under Slurm with the co-scheduler the step's cpuset is the allowance, and the mask
        # slurmstepd binds a task to at launch is not a limit (it does not widen when the cpuset
        # grows): MALLEABLE_TF_ALLOWANCE=cgroup turns mask restrictions off.
        self.mask_restricts = mask_restricts
        self.pinned: frozenset[int] | None = None
        self._outside_mask: frozenset[int] | None = None
        self.current = self.read()

    def refresh(self) -> bool:
        """Read the allowance again; True when it changed."""
        new = self.read()
        if new == self.current:
            return False
        self.current = new
        return True

    def read(self) -> Allowance:
        """The cpuset cgroup is the allowance where it can be read; an affinity mask narrower
        than it counts only when someone outside set it (taskset), not when it is our own
        pinning or what the kernel left of it after a cpuset change (pinned & cpuset on kernels
        >= 6.2, the whole cpuset on older ones)."""
        mask = self._read_affinity()
        cpuset = self.cgroup.cpuset()

        def explained() -> set:
            out = set()
            if self.pinned is not None:
                out.add(self.pinned)
                if cpuset:
                    out.add(self.pinned & cpuset)
            return out

        if mask not in explained():
            # Before taking it for a taskset, make sure the cpuset is read from where the
            # process is now: a move to another cgroup also rewrites the mask.
            self.cgroup.invalidate()
            cpuset = self.cgroup.cpuset()
        if mask not in explained():
            restricts = self.mask_restricts or not cpuset
            self._outside_mask = None if (cpuset and mask >= cpuset) or not restricts else mask
        if cpuset:
            cpus = (cpuset & self._outside_mask) if self._outside_mask else cpuset
            cpus = cpus or cpuset
        else:
            cpus = self._outside_mask or mask
        return Allowance(cpus=frozenset(cpus), quota_cpus=self.cgroup.quota())

    def effective(self, target: Target | None) -> Allowance:
        """The allowance capped by the agent's target (a target disjoint from it is stale)."""
        if target is None:
            return self.current
        capped = self.current.cpus & target.cpus
        if not capped:
            return self.current
        return Allowance(cpus=capped, quota_cpus=self.current.quota_cpus)


# Set by torchrun (torch.distributed.run) in every worker it starts: only then are RANK and
# LOCAL_RANK its (other programs set variables of these names for their own purposes).
TORCHRUN_MARK = "TORCHELASTIC_RUN_ID"


def local_rank_and_size(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """This process's rank among the ranks of its node, from the launcher's environment:
    torchrun's (the innermost launcher: under srun, Slurm's variables are its agent's), then
    Open MPI's mpirun, then Slurm's srun, then Horovod's gloo runner; (0, 1) alone. A bad value
    raises ValueError naming its variable."""
    env = os.environ if env is None else env
    if TORCHRUN_MARK in env and "LOCAL_RANK" in env and "LOCAL_WORLD_SIZE" in env:
        return _env_count(env, "LOCAL_RANK"), _env_count(env, "LOCAL_WORLD_SIZE")
    for rank_key, size_key in (("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                               ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")):
        if rank_key in env and size_key in env:
            return _env_count(env, rank_key), _env_count(env, size_key)
    if "SLURM_LOCALID" in env and "SLURM_STEP_TASKS_PER_NODE" in env:
        try:
            per_node = expand_tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"])
        except ValueError:
            raise ValueError("SLURM_STEP_TASKS_PER_NODE must be Slurm's task counts, e.g. "
                             f"'2(x3),1', not {env['SLURM_STEP_TASKS_PER_NODE']!r:.32}") from None
        node_id = _env_count(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
        if node_id < len(per_node):
            return _env_count(env, "SLURM_LOCALID"), per_node[node_id]
    return 0, 1


def _env_count(env: Mapping[str, str], key: str) -> int:
    value = env[key]
    if not re.fullmatch(r"[0-9]{1,9}", value):    # ASCII digits: "²".isdigit() is True
        raise ValueError(f"{key} must be a number >= 0, not {value!r:.32}")
    return int(value)


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's compressed task counts: "2(x3),1" -> [2, 2, 2, 1]."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ValueError(f"malformed tasks-per-node {text!r}")
        out += [int(m[1])] * int(m[2] or 1)
    return out

