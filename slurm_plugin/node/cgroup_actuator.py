"""Rewrites the cpusets of a Slurm job's cgroup folders, in an order the kernel accepts.

cgroup v1: a parent cannot drop CPUs a child still uses ("Device or resource busy"), so every
folder is first widened top-down (job folder, then steps) and then narrowed bottom-up. cgroup
v2 bounds a child by its parent's effective CPUs instead and accepts either order; the same code
path serves it. Where the folders are is the node's ``SlurmCgroupLayout`` (``slurm_plugin.cgroups``).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from itertools import islice
from typing import Callable, Mapping
from pathlib import Path

from slurm_plugin.cgroups import (CPUS_FILE, SLUID_RE, CgroupVersion, SlurmCgroupLayout,
                                  read_pids)
from malleable_protocol.cpulist import format_cpu_list, parse_cpu_list
from malleable_protocol.errors import FixableError, printable

log = logging.getLogger(__name__)


class ActuatorError(FixableError, RuntimeError):
    pass


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


@dataclass(frozen=True)
class CgroupJob:
    """A job folder found on the node: its owner, its CPUs, whether every step folder agrees
    with it (see ``folder_cpus``), and the folders below it that Slurm did not make."""

    uid: int | None            # v1: from the uid_<U> folder; v2: not in the path (root's folders)
    job_id: int
    cpus: frozenset[int]
    folders: dict[str, frozenset[int]]          # Slurm's step folders (relative path) -> CPUs
    foreign: tuple[str, ...] = ()               # others (the first few), never walked nor written
    unsealed: bool = False                      # a Slurm folder below it is not root's (v1)
    scan_cpu_s: float = field(default=0.0, compare=False)   # what walking it cost (its user's)

    def in_line(self, step_cpus: Mapping[str, frozenset[int]] | None = None) -> bool:
        return all(cpus == folder_cpus(rel, self.cpus, step_cpus)
                   for rel, cpus in self.folders.items())


def folder_cpus(rel: str, cpus: frozenset[int],
                step_cpus: Mapping[str, frozenset[int]] | None = None) -> frozenset[int]:
    """What the folder ``rel`` (below the job folder) should hold when the job holds ``cpus``:
    all of them, or its step's block when ranks of several steps share the node
    (``model.split_among_steps``). Every step may hold more than Slurm's allocation: a new
    step's slurmstepd resets the job folder to the allocation, which the kernel refuses while a
    child holds more, so the SPANK plugin brings the job back first (``hooks.step_start``)."""
    if step_cpus:
        return step_cpus.get(rel.split("/", 1)[0], cpus)
    return cpus


# Below a job folder Slurm makes steps (v1: step_<S>/task_<T>; v2: step_<S>/slurm and
# step_<S>/user/task_<T>). Only those names are walked, at most MAX_DEPTH levels and
# MAX_FOLDERS of them; anything else is reported as foreign, never entered (a job user can
# nest thousands of folders in his v1 step folders).
MAX_DEPTH = 3
MAX_FOLDERS = 1024
MAX_FOREIGN_NAMED = 4
# Threads whose CPU masks one grow looks at (about 2 us each): a job's user can start as many
# as his limits allow, and root's cycle must not grow with them.
MAX_WIDEN_THREADS = 8192


def walk_job(layout: SlurmCgroupLayout, top: str) -> tuple[list[str], tuple[str, ...]]:
    """Slurm's folders below the job folder ``top`` (paths, parents before children: named as
    Slurm names them, with root's files) and the first few foreign ones (relative paths).
    Links are never followed; a folder is listed at most ``MAX_FOLDERS`` entries deep, so a
    folder of a million entries costs what 1,024 do."""
    found, foreign = _walk(layout, top)
    return [path for path, _ in found], foreign


def _walk(layout: SlurmCgroupLayout, top: str) -> tuple[list[tuple[str, int]], tuple[str, ...]]:
    """``walk_job``, each Slurm folder with its owner's uid. A folder is listed only when it
    has folders in it: cgroupfs, like most file systems, counts a folder's subfolders in its
    link count (2 + subfolders; kernfs_refresh_inode), which the stat each entry needs anyway
    gives: a job's many leaf task folders cost one stat each, not a listing."""
    out: list[tuple[str, int]] = []
    foreign: list[str] = []
    try:
        st = os.lstat(top)
    except OSError:
        return out, ()
    level = [("", st.st_nlink)]
    for _ in range(MAX_DEPTH):
        nxt: list[tuple[str, int]] = []
        for rel, nlink in level:
            if nlink == 2:
                continue             # no folder in it
            for entry in _subfolders(f"{top}/{rel}" if rel else top):
                child = f"{rel}/{entry.name}" if rel else entry.name
                if layout.slurm_child(rel, entry.name) and len(out) < MAX_FOLDERS:
                    est = _lstat(entry)
                    if est is None:
                        continue        # gone meanwhile (a step that ended)
                    if est.st_uid == 0 or _files_are_roots(f"{top}/{child}"):
                        nxt.append((child, est.st_nlink))
                        out.append((f"{top}/{child}", est.st_uid))
                        continue
                if len(foreign) < MAX_FOREIGN_NAMED:
                    foreign.append(printable(child, 200))   # its user's name, bound for logs
        level = nxt
        if not level:
            break
    return out, tuple(foreign)


def _lstat(entry: os.DirEntry) -> os.stat_result | None:
    try:
        return entry.stat(follow_symlinks=False)
    except OSError:
        return None


# The kernel gives a new cgroup's files to whoever made it. slurmstepd makes Slurm's folders
# as root (22.05 then gives the folder, not its files, to the job's user); a folder a user
# made under a name Slurm uses (task_4242) has a cpuset.cpus its maker can write (and so keep
# a borrowed core in), and is not Slurm's. A folder without that file holds no CPUs of its own.
# A folder root owns is root's making (no user can make one) or sealed by the agent: Slurm's.
def _files_are_roots(folder: str) -> bool:
    try:
        return os.stat(os.path.join(folder, CPUS_FILE), follow_symlinks=False).st_uid == 0
    except OSError:
        return True


def _subfolders(folder: str) -> list[os.DirEntry]:
    """The folders in ``folder`` (no link), by name, among its first entries only: none when
    it cannot be listed (gone meanwhile)."""
    try:
        with os.scandir(folder) as it:
            return sorted((e for e in islice(it, 64 + MAX_FOLDERS)
                           if e.is_dir(follow_symlinks=False)), key=lambda e: e.name)
    except OSError:
        return []


def _make_roots(folder: str) -> None:
    """``folder`` and its files root's, through one descriptor of it, no link followed."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchown(fd, 0, 0)
        for name in os.listdir(fd):
            try:
                os.chown(name, 0, 0, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
    finally:
        os.close(fd)


def _move_processes(folder: str, home: str) -> None:
    """Every process in ``folder`` into ``home`` (root writes its cgroup.procs)."""
    for pid in read_pids(folder):
        try:
            with open(os.path.join(home, "cgroup.procs"), "w") as f:
                f.write(str(pid))
        except OSError:
            continue                  # exited meanwhile


# A hook run before the n-th cpuset write (n, the folder): a fault-injection point that tests
# pass in (tests/programs/slurm_plugin_agent_stopping_at_write.py); production passes none.
WriteHook = Callable[[int, str], None]


class CpusetActuator:
    def __init__(self, layout: SlurmCgroupLayout, before_write: WriteHook | None = None):
        self.layout = layout
        self._before_write = before_write
        self._writes = 0
        # The last scan's job folders named by a SLUID that no slurmstepd in them tells yet (just
        # made, or ending): their CPUs, by folder name. Whose cores they are is unknown.
        self.unidentified: dict[str, frozenset[int]] = {}

    def current(self, uid: int, job_id: int) -> frozenset[int] | None:
        """The job folder's CPUs, or None when the folder does not exist (yet)."""
        return read_cpus(self.layout.job_dir(uid, job_id))

    def node_cpus(self) -> frozenset[int]:
        """The CPUs of slurmd's own folder for this node (empty when it is not made yet)."""
        return read_cpus(self.layout.node_dir()) or frozenset()

    def scan(self) -> dict[int, CgroupJob]:
        """Every job folder of this node, with its step folders' CPUs (one read each). Job
        folders named by a SLUID no slurmstepd tells yet are left in ``unidentified``."""
        found: dict[int, CgroupJob] = {}
        unidentified: dict[str, frozenset[int]] = {}
        for uid, parent in self.layout.job_parents():
            try:
                names = os.listdir(parent)
            except OSError:
                continue
            if uid is None:
                self.layout.names.keep(names)
            for name in names:
                t0 = time.thread_time()
                job_id = self.layout.job_id_of(name)
                if job_id is None and not (uid is None and SLUID_RE.fullmatch(name)):
                    continue   # no job folder
                top = os.path.join(parent, name)
                cpus = read_cpus(top)
                if not cpus:
                    continue   # being made or removed
                if job_id is None:
                    unidentified[name] = cpus
                    continue
                below, foreign = _walk(self.layout, top)
                folders = {f[len(top) + 1:]: read_cpus(f) or frozenset() for f, _ in below}
                found[job_id] = CgroupJob(uid, job_id, cpus, folders, foreign,
                                          unsealed=any(owner != 0 for _, owner in below),
                                          scan_cpu_s=time.thread_time() - t0)
        self.unidentified = unidentified
        return found

    def apply(self, uid: int, job_id: int, cpus: frozenset[int],
              step_cpus: Mapping[str, frozenset[int]] | None = None, *,
              allocation: frozenset[int] | None = None) -> None:
        """Give the job ``cpus``, and each step folder its share (see ``folder_cpus``). Cores
        beyond its ``allocation`` (borrowed) are given only to a sealed job: every folder below
        it root's, none but Slurm's (``seal``), so that no folder its user makes can hold a
        borrowed core and make the reclaim fail (v1's EBUSY)."""
        if not cpus:
            raise ValueError("a job cannot be left without CPUs")
        job_dir = self.layout.job_dir(uid, job_id)
        if not job_dir.is_dir():
            raise ActuatorError(f"no cgroup folder {job_dir}")
        top = str(job_dir)
        if allocation is not None and not cpus <= allocation:
            self.seal(top)
        below, foreign = walk_job(self.layout, top)
        if foreign and allocation is not None and not cpus <= allocation:
            raise ActuatorError(f"job {job_id} has folders Slurm did not make "
                                f"({', '.join(foreign)}): it is not lent cores")
        folders = [top] + below
        desired = {f: folder_cpus(f[len(top) + 1:], cpus, step_cpus) if f != top else cpus
                   for f in folders}
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
                try:
                    self._write(f, desired[f])
                except ActuatorError:
                    # v1: a folder its user made below this one holds a CPU being taken
                    # (EBUSY). It is taken from him, its processes moved up here; once.
                    if not foreign or self.layout.version is not CgroupVersion.V1:
                        raise
                    self.evict_foreign(folders)
                    self._write(f, desired[f])
        if old[top] < cpus:
            self._widen_masks(folders, old[top], desired)

    def evict_foreign(self, slurm: list[str]) -> int:
        """Remove what the job's user made below its Slurm folders (v1, where slurmstepd gives
        him the step and task folders, so a task folder made after the job was sealed is his
        for a while): every such folder, and all below it, is made root's first (files too:
        he can neither make folders in it nor open its files again), then, deepest first,
        its processes are moved up into the Slurm folder it is in and it is removed. At most
        ``MAX_FOLDERS`` are taken; ActuatorError when more remain. ``slurm``: the job folder
        and Slurm's folders below it (``walk_job``), parents first. Returns how many were
        removed."""
        top = slurm[0]
        mine = set(slurm)
        taken: list[tuple[str, str]] = []            # (folder, the Slurm folder it is in)
        level = [(f, f) for f in slurm]
        while level:
            nxt = []
            for folder, home in level:
                for entry in _subfolders(folder):
                    child = os.path.join(folder, entry.name)
                    if child in mine:
                        continue
                    if len(taken) >= MAX_FOLDERS:
                        raise ActuatorError(f"{top}: more than {MAX_FOLDERS} folders its user "
                                            "made: not all can be taken back")
                    _make_roots(child)
                    taken.append((child, home))
                    nxt.append((child, home))
            level = nxt
        removed = 0
        for folder, home in reversed(taken):
            for _ in range(20):
                _move_processes(folder, home)
                try:
                    os.rmdir(folder)
                    removed += 1
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)      # a process forked as it was moved: once more
            else:
                raise ActuatorError(f"{folder}: its user's folder cannot be removed")
        if taken:
            log.warning("%s: took back and removed %d folder(s) its user made", top, removed)
        return removed

    def seal_job(self, uid: int, job_id: int) -> None:
        self.seal(str(self.layout.job_dir(uid, job_id)))

    def seal(self, top: str) -> None:
        """Make every Slurm folder below the job folder ``top`` root's: on v1 slurmstepd gives
        the step and task folders to the job's user, who could make cpusets in them. Folders
        are opened without following links; a folder that vanished (a step ended) is skipped."""
        for folder in walk_job(self.layout, top)[0]:
            try:
                fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                if os.fstat(fd).st_uid != 0:
                    os.fchown(fd, 0, 0)
            finally:
                os.close(fd)

    def _widen_masks(self, folders: list[str], was: frozenset[int],
                     desired: Mapping[str, frozenset[int]]) -> int:
        """After a grow, the threads bound to exactly the job's former CPUs get the CPUs of
        their folder. The kernel widens a task with its cpuset only while the task never set
        its own mask (Linux >= 6.2 keeps a mask a process set, intersected with the cpuset);
        slurmstepd sets one on cgroup v2 (Slurm 24.11, tests/fixtures/slurm-24.11-cgroup-v2),
        so its tasks would stay on their first cores. A thread bound to fewer cores (a user's
        own binding) is left as it is. The job's user chooses how many threads there are: at
        most ``MAX_WIDEN_THREADS`` are looked at, those past it keep their masks (the job's
        own loss). Returns how many were looked at."""
        seen = 0
        for folder in folders:
            for pid in read_pids(folder, 1 << 16):
                if seen >= MAX_WIDEN_THREADS:
                    log.warning("%s: more than %d threads: the rest keep their CPU masks",
                                folders[0], MAX_WIDEN_THREADS)
                    return seen
                try:
                    tids = os.listdir(f"/proc/{pid}/task")
                except OSError:
                    continue
                for tid in tids[:MAX_WIDEN_THREADS - seen]:
                    seen += 1
                    try:
                        if frozenset(os.sched_getaffinity(int(tid))) == was:
                            self._set_affinity(int(tid), desired[folder])
                    except (OSError, ValueError):
                        continue      # exited meanwhile
        return seen

    _set_affinity = staticmethod(os.sched_setaffinity)

    def _write(self, folder: Path | str, cpus: frozenset[int]) -> None:
        self._writes += 1
        if self._before_write is not None:
            self._before_write(self._writes, str(folder))
        try:
            with open(os.path.join(folder, CPUS_FILE), "w") as f:
                f.write(format_cpu_list(cpus))
        except FileNotFoundError:
            return  # a step that just ended
        except OSError as exc:
            raise ActuatorError(f"writing {format_cpu_list(cpus)} to {folder}: {exc}") from exc
