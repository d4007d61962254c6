"""The one owner of Slurm's cgroup layout on a node: where slurmd and slurmstepd put a node's
job, step and task folders, discovered from the node, never assumed.

What decides it (Slurm's src/common/cgroup.c and its cgroup/v1 and cgroup/v2 plugins):
- the cgroup version: ``CgroupPlugin`` in cgroup.conf (cgroup/v1, cgroup/v2, autodetect, which
  looks at the file system mounted at ``CgroupMountpoint``);
- how slurmd was built: with ``--enable-multiple-slurmd`` (Debian's packages) the node's folder is
  named after the node, ``slurm_<node>`` (v1) or ``<node>_slurmstepd.scope`` (v2); without it
  (SchedMD's packages, OpenHPC, most sites) ``slurm`` or ``slurmstepd.scope``.

v1: ``<cpuset mount>/<root>/uid_<U>/job_<J>/step_<S>[/task_<T>]``.
v2: ``<mount>/system.slice/<scope>/job_<J>/step_<S>/{slurm,user/task_<T>}``. Slurm 26.05 names
the job folder by the job's SLUID instead (``s`` and 13 characters), unless cgroup.conf says
``CgroupJobIdPaths=yes`` (26.05.2 and later); ``JobFolderNames`` tells which job such a folder is.

``discover_layout`` reads the mount table, cgroup.conf and which of the candidate node folders
slurmd made (or, before any, where the node's slurmstepd processes live), and raises
``LayoutUnknown``, saying what it looked for, when the evidence is missing or disagrees. Every
other module, test and benchmark asks a ``SlurmCgroupLayout`` for a path.
"""
from __future__ import annotations

import enum
import os
import re
import signal
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

from malleable_protocol.cgroupfs import Mount, cpuset_cgroup, parse_mountinfo, parse_status_uid
from malleable_protocol.layout import check_job_id, check_node_name, check_step_name
from malleable_protocol.errors import FixableError
from slurm_plugin.settings import local_slurm_conf, root_settings

DEFAULT_MOUNT = Path("/sys/fs/cgroup")
CPUS_FILE = "cpuset.cpus"
_STEP_NAME = re.compile(r"step_(?:[0-9]{1,10}|batch|interactive|extern)")
_TASK_NAME = re.compile(r"task_[0-9]{1,10}")
_JOB_NAME = re.compile(r"job_([0-9]{1,10})")   # [0-9]: isdigit() takes "²"


class CgroupVersion(enum.Enum):
    V1 = "v1"
    V2 = "v2"


class LayoutUnknown(FixableError, RuntimeError):
    """The node's layout could not be told from the node: the message says what was looked for."""


def hierarchy_dir(version: CgroupVersion, mount: Path = DEFAULT_MOUNT) -> Path:
    """Where the hierarchy with the cpuset controller is mounted: v1 ``<mount>/cpuset``, v2 the
    unified mount itself."""
    return Path(mount) / "cpuset" if version is CgroupVersion.V1 else Path(mount)


def _check_uid(uid: int) -> int:
    if isinstance(uid, bool) or not isinstance(uid, int) or not 0 <= uid < 2**32:
        raise ValueError(f"invalid uid {uid!r}")
    return uid


@dataclass(frozen=True)
class SlurmCgroupLayout:
    """Where a node's job folders are. ``hierarchy`` is the folder where the cgroup hierarchy
    with the cpuset controller is mounted (v1: .../cpuset; v2: the unified mount), ``root`` the
    node's folder in it as /proc/<pid>/cgroup names it ("/slurm_n1", "/slurm",
    "/system.slice/n1_slurmstepd.scope", "/system.slice/slurmstepd.scope")."""

    node: str
    version: CgroupVersion
    hierarchy: Path
    root: str
    # Which job a v2 job folder named by SLUID is (told once, kept for the layout's life).
    names: "JobFolderNames" = field(default_factory=lambda: JobFolderNames(), compare=False,
                                    repr=False)

    @classmethod
    def named(cls, node: str, version: CgroupVersion, *, multiple_slurmd: bool,
              mount: Path = DEFAULT_MOUNT) -> "SlurmCgroupLayout":
        """The layout Slurm's naming rule gives for a build and version (no look at the node)."""
        check_node_name(node)
        if version is CgroupVersion.V1:
            return cls(node, version, hierarchy_dir(version, mount),
                       f"/slurm_{node}" if multiple_slurmd else "/slurm")
        return cls(node, version, hierarchy_dir(version, mount),
                   f"/system.slice/{node + '_' if multiple_slurmd else ''}slurmstepd.scope")

    @property
    def multiple_slurmd(self) -> bool:
        return self.root != "/slurm" and self.root != "/system.slice/slurmstepd.scope"

    def describe(self) -> str:
        build = "multiple-slurmd build" if self.multiple_slurmd else "one slurmd per host"
        below = "uid_<U>/job_<J>/step_<S>" if self.version is CgroupVersion.V1 else \
            "job_<J> or <SLUID>/step_<S>/user/task_<T>"
        return f"cgroup {self.version.value}, {self.node_dir()}/{below} ({build})"

    # --- paths ---------------------------------------------------------------------------

    def node_dir(self) -> Path:
        return self.hierarchy / self.root.lstrip("/")

    def job_dir(self, uid: int, job_id: int) -> Path:
        check_job_id(job_id)
        if self.version is CgroupVersion.V1:
            return self.node_dir() / f"uid_{_check_uid(uid)}" / f"job_{job_id}"
        return self.node_dir() / self.names.folder_of(self, job_id)

    def job_id_of(self, name: str) -> int | None:
        """The job a job folder named ``name`` is (``job_<J>``, or on v2 a SLUID a slurmstepd
        in it tells); None for any other name, or a SLUID no slurmstepd tells yet."""
        m = _JOB_NAME.fullmatch(name)
        if m:
            return int(m[1])
        if self.version is CgroupVersion.V2 and SLUID_RE.fullmatch(name):
            return self.names.job_of(self, name)
        return None

    def step_dir(self, uid: int, job_id: int, step: str) -> Path:
        return self.job_dir(uid, job_id) / check_step_name(step)

    def cpus_file(self, uid: int, job_id: int, step: str | None = None) -> Path:
        folder = self.job_dir(uid, job_id) if step is None else self.step_dir(uid, job_id, step)
        return folder / CPUS_FILE

    def made_folders(self) -> list[Path]:
        """The node folders slurmd made. On v1 it names them alike in every hierarchy, and
        makes the freezer's (proctrack/cgroup) when it starts, the cpuset's only with the
        first job: any of them tells. On v2, its scope."""
        if self.version is CgroupVersion.V2:
            return [self.node_dir()] if self.node_dir().is_dir() else []
        return sorted(p for p in self.hierarchy.parent.glob(f"*/{self.root.lstrip('/')}")
                      if p.is_dir())

    def job_parents(self) -> Iterator[tuple[int | None, str]]:
        """The folders holding this node's job folders, with the uid each stands for (v1's
        ``uid_<U>``; None on v2, where the owner is not in the path)."""
        node_dir = str(self.node_dir())
        if self.version is CgroupVersion.V2:
            yield None, node_dir
            return
        try:
            names = os.listdir(node_dir)
        except OSError:
            return
        for d in names:
            if d.startswith("uid_") and d[4:].isdigit():
                yield int(d[4:]), os.path.join(node_dir, d)

    # --- reading /proc/<pid>/cgroup paths --------------------------------------------------

    def step_of(self, path: str, job_id: int) -> str | None:
        """``step_0`` when ``path`` (as /proc/<pid>/cgroup names it) is in a step folder of
        ``job_id`` on this node; None for any other folder (another node's slurmd on the same
        host, another job, the job folder itself)."""
        head = self.root + "/"
        if not (path + "/").startswith(head):
            return None
        rest = path[len(head):].split("/")
        if self.version is CgroupVersion.V1:
            if len(rest) < 3 or not rest[0].startswith("uid_"):
                return None
            rest = rest[1:]
        if len(rest) < 2 or not _STEP_NAME.fullmatch(rest[1]) or \
                self.job_id_of(rest[0]) != job_id:
            return None        # not a step folder Slurm names (a user's own folder on v1)
        return rest[1]

    def job_of(self, path: str) -> int | None:
        """The job whose folder (or a folder below it) ``path`` is, on this node."""
        head = self.root + "/"
        if not (path + "/").startswith(head):
            return None
        rest = path[len(head):].split("/")
        if self.version is CgroupVersion.V1:
            rest = rest[1:] if rest and rest[0].startswith("uid_") else []
        return self.job_id_of(rest[0]) if rest else None

    def step_set_up(self, step: str, folders: Mapping[str, frozenset[int]],
                    stepd_path: str | None, job_id: int) -> bool:
        """Whether a starting step's slurmstepd has written its cpusets (so a fence on the job
        can lift). v1 (Slurm 22.05): it makes the step folder, writes the job's then the
        step's CPUs, then joins it: the step folder holds CPUs, or its slurmstepd is in it.
        v2 (Slurm 24.11): the step folder and slurmstepd's place in it (step_<S>/slurm) exist
        before the SPANK plugin runs, so neither tells; its tasks' folders
        (step_<S>/user/task_<T>) are made when the tasks start, after the writes."""
        if self.version is CgroupVersion.V1:
            return bool(folders.get(step)) or \
                (stepd_path is not None and self.step_of(stepd_path, job_id) == step)
        return any(rel.startswith(f"{step}/user/task_") for rel in folders)

    def slurm_child(self, parent: str, name: str) -> bool:
        """Whether slurmstepd makes a folder ``name`` in ``parent`` (a path below the job
        folder, "" for the job folder itself). v1: ``step_<S>/task_<T>``; v2:
        ``step_<S>/slurm`` and ``step_<S>/user/task_<T>`` (``task_special`` for processes of
        no task). Any other folder was made by someone else (on v1 the job's user owns the
        step and task folders and can make folders in them)."""
        parts = [p for p in parent.split("/") if p]
        if not parts:
            return _STEP_NAME.fullmatch(name) is not None
        if self.version is CgroupVersion.V1:
            return len(parts) == 1 and _TASK_NAME.fullmatch(name) is not None
        if len(parts) == 1:
            return name in ("slurm", "user")
        return len(parts) == 2 and parts[1] == "user" and \
            (name == "task_special" or _TASK_NAME.fullmatch(name) is not None)

    def another_nodes(self, path: str) -> bool:
        """Whether ``path`` is in another node's folder of a multiple-slurmd build on the same
        host (never, with one slurmd per host)."""
        if not self.multiple_slurmd or (path + "/").startswith(self.root + "/"):
            return False
        top = path.lstrip("/").split("/")
        if self.version is CgroupVersion.V1:
            return top[0].startswith("slurm_")
        return len(top) >= 2 and top[0] == "system.slice" and \
            top[1].endswith("_slurmstepd.scope")

    def misplaced(self, path: str, job_id: int) -> bool:
        """A folder named for ``job_id`` (a ``job_<id>`` component) that is not where this
        layout puts that job on this node, nor another node's: the node's layout is not what
        was discovered."""
        return f"job_{job_id}" in path.split("/") and self.job_of(path) != job_id and \
            not self.another_nodes(path)


# --- discovery ------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayoutEvidence:
    """What a node shows about its layout; gathered by ``gather_evidence``, judged by the pure
    ``decide_layout``."""

    node: str
    mount: Path                                # CgroupMountpoint
    mounts: tuple[Mount, ...]                  # /proc/self/mountinfo
    plugin: str | None                         # CgroupPlugin from cgroup.conf, if it says
    v2_controllers: frozenset[str]             # cgroup.controllers of the v2 mount
    existing: frozenset[str]                   # candidate node folders that exist
    stepd_paths: tuple[str, ...] = ()          # cpuset folders of slurmstepd processes


# Slurm 26.05's SLUID as cgroup/v2 names a job folder by it (src/common/sluid.c, print_sluid:
# "s" and 13 characters of Crockford's base 32, the first only the cluster id's top 4 bits).
# Matched whole (fullmatch).
SLUID_RE = re.compile(r"s[0-9A-F][0-9A-HJKMNP-TV-Z]{12}")


def candidates(node: str, version: CgroupVersion, mount: Path) -> list[SlurmCgroupLayout]:
    return [SlurmCgroupLayout.named(node, version, multiple_slurmd=m, mount=mount)
            for m in (True, False)]


def cgroup_version_of(ev: LayoutEvidence) -> CgroupVersion:
    """The version Slurm uses, as its autodetect would find it, checked against CgroupPlugin."""
    base = str(ev.mount).rstrip("/")
    v1_cpuset = any(m.fstype == "cgroup" and "cpuset" in m.super_options and
                    m.point == f"{base}/cpuset" for m in ev.mounts)
    v2_at_base = any(m.fstype == "cgroup2" and m.point == base for m in ev.mounts)
    v2_cpuset = v2_at_base and "cpuset" in ev.v2_controllers
    plugin = (ev.plugin or "autodetect").strip().lower()
    if plugin in ("cgroup/v1", "v1"):
        if not v1_cpuset:
            raise LayoutUnknown(f"cgroup.conf says CgroupPlugin={ev.plugin}, but no cgroup v1 "
                                f"cpuset hierarchy is mounted at {base}/cpuset")
        return CgroupVersion.V1
    if plugin in ("cgroup/v2", "v2"):
        if not v2_cpuset:
            raise LayoutUnknown(f"cgroup.conf says CgroupPlugin={ev.plugin}, but the unified "
                                f"hierarchy at {base} has no cpuset controller "
                                f"(controllers: {' '.join(sorted(ev.v2_controllers)) or 'none'})")
        return CgroupVersion.V2
    if plugin != "autodetect":
        raise LayoutUnknown(f"unknown CgroupPlugin={ev.plugin} in cgroup.conf")
    # Slurm's autodetect: cgroup2 mounted at the mount point means v2, else v1 (hybrid hosts).
    if v2_at_base:
        if not v2_cpuset:
            raise LayoutUnknown(f"cgroup v2 at {base} has no cpuset controller")
        return CgroupVersion.V2
    if v1_cpuset:
        return CgroupVersion.V1
    raise LayoutUnknown(f"neither a cgroup v1 cpuset hierarchy ({base}/cpuset) nor cgroup v2 "
                        f"({base}) is mounted")


def decide_layout(ev: LayoutEvidence) -> SlurmCgroupLayout:
    """The node's layout from the evidence, or ``LayoutUnknown`` with what was looked for.
    A node-named folder is this node's (multiple-slurmd); else the plain one; before slurmd has
    made either, the folders its slurmstepd processes run in."""
    version = cgroup_version_of(ev)
    cands = candidates(ev.node, version, ev.mount)
    for layout in cands:
        if str(layout.node_dir()) in ev.existing:
            return layout
    for layout in cands:
        if any((p + "/").startswith(layout.root + "/") for p in ev.stepd_paths):
            return layout
    looked = ", ".join(str(c.node_dir()) if version is CgroupVersion.V2 else
                       f"{ev.mount}/*{c.root}" for c in cands)
    raise LayoutUnknown(f"no Slurm cgroup folder for node {ev.node} ({version.value}): looked for "
                        f"{looked} and for slurmstepd processes in them; is slurmd running as "
                        f"{ev.node} with task/cgroup?")


def read_cgroup_conf(path: Path | None) -> dict[str, str]:
    """``Key=Value`` lines of cgroup.conf (keys lower-cased; comments and blanks skipped)."""
    out: dict[str, str] = {}
    if path is None:
        return out
    try:
        text = path.read_text(errors="replace")[:1 << 20]
    except OSError:
        return out
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


@dataclass(frozen=True)
class StepdProcess:
    """A slurmstepd on this host: the job it serves (from the title slurmstepd gives itself,
    "slurmstepd: [<job>.<step>]") and its cpuset folder as /proc/<pid>/cgroup names it."""

    pid: int
    job_id: int | None
    cgroup: str


def _title_parts(cmdline: bytes) -> tuple[int, str] | None:
    """The job id and the text after its dot in slurmstepd's title ("slurmstepd: [5.batch]":
    5, "batch"); None when it is no slurmstepd's title or names no valid job id."""
    text = cmdline.split(b"\0", 1)[0].decode(errors="replace")
    head, sep, rest = text.partition("[")
    if not sep or not head.startswith("slurmstepd"):
        return None
    job, _, step = rest.split("]", 1)[0].partition(".")
    return (int(job), step) if job.isascii() and job.isdigit() and 0 < int(job) < 2**32 \
        else None


def parse_stepd_title(cmdline: bytes) -> int | None:
    """The job id in slurmstepd's title ("slurmstepd: [5.batch]"); None for any other."""
    parts = _title_parts(cmdline)
    return parts[0] if parts is not None else None


def _read_at(dir_fd: int, name: str, limit: int) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _owned_by_root(entry: os.DirEntry) -> bool:
    try:
        return entry.stat(follow_symlinks=False).st_uid == 0
    except OSError:
        return False         # exited


def stepd_title(cmdline: bytes) -> tuple[int, str] | None:
    """The job id and step folder in slurmstepd's title ("slurmstepd: [5.batch]": 5,
    "step_batch"); None for any other."""
    parts = _title_parts(cmdline)
    if parts is None or not _STEP_NAME.fullmatch(f"step_{parts[1]}"):
        return None
    return parts[0], f"step_{parts[1]}"


def _stepd_at(proc: Path, name: str) -> tuple[StepdProcess, bytes] | None:
    """Process ``name`` of ``proc`` if it is a slurmstepd of root's (every uid 0), with its
    command line; its files read through one descriptor of its /proc folder, so a pid taken
    over meanwhile reads nothing."""
    try:
        dfd = os.open(proc / name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if _read_at(dfd, "comm", 64).strip() != b"slurmstepd" or \
                parse_status_uid(_read_at(dfd, "status", 8192)) != 0:
            return None
        cmdline = _read_at(dfd, "cmdline", 256)
        path = cpuset_cgroup(_read_at(dfd, "cgroup", 65536).decode(errors="replace"))
    except OSError:
        return None
    finally:
        os.close(dfd)
    return StepdProcess(int(name), parse_stepd_title(cmdline), path or ""), cmdline


MAX_STEPS_LOOKED_AT = 64      # step folders of one SLUID folder read to tell its job


def stepd_job_in(layout: SlurmCgroupLayout, name: str, proc: Path = Path("/proc")) -> int | None:
    """The job of the v2 job folder ``name`` (a SLUID), as a slurmstepd in it says: a process
    of root's in one of its ``step_<S>/slurm`` folders (root's, and only root can move a
    process into them), whose cgroup is that folder and whose title is "[<J>.<S>]" for that
    same step. None while no such process is there (the folder being made or removed)."""
    top = layout.node_dir() / name
    try:
        with os.scandir(top) as it:
            steps = sorted(e.name for e in it if _STEP_NAME.fullmatch(e.name)
                           and e.is_dir(follow_symlinks=False))
    except OSError:
        return None
    for step in steps[:MAX_STEPS_LOOKED_AT]:
        home = top / step / "slurm"
        try:
            st = os.lstat(home)
        except OSError:
            continue
        if st.st_uid != 0 or not stat.S_ISDIR(st.st_mode):
            continue
        for pid in read_pids(home, 4096)[:8]:
            seen = _stepd_at(proc, str(pid))
            if seen is None:
                continue
            process, cmdline = seen
            title = stepd_title(cmdline)
            if title is not None and title[1] == step and \
                    process.cgroup == f"{layout.root}/{name}/{step}/slurm":
                return title[0]
    return None


class JobFolderNames:
    """Which job a v2 job folder is. ``job_<J>`` says so itself. Slurm 26.05 names it by the
    job's SLUID unless cgroup.conf says CgroupJobIdPaths=yes: a string id made from the time
    and the cluster, not from the job id, that only a slurmstepd in the folder tells
    (``stepd_job_in``). A SLUID once told stays its job's (a requeued job gets a new one); it is
    forgotten when its folder goes (``keep``). ``stepd_job``: how to ask (tests give their
    own)."""

    def __init__(self, stepd_job: Callable[[SlurmCgroupLayout, str], int | None] = stepd_job_in):
        self._stepd_job = stepd_job
        self._jobs: dict[str, int] = {}

    def job_of(self, layout: SlurmCgroupLayout, name: str) -> int | None:
        job = self._jobs.get(name)
        if job is None:
            job = self._stepd_job(layout, name)
            if job is not None:
                self._jobs[name] = job
        return job

    def folder_of(self, layout: SlurmCgroupLayout, job_id: int) -> str:
        """The name of ``job_id``'s folder: ``job_<J>`` unless that is missing and a SLUID
        folder is told to be the job's (``job_<J>`` then: a folder that is not there)."""
        plain = f"job_{job_id}"
        node_dir = layout.node_dir()
        if (node_dir / plain).is_dir():
            return plain            # one stat where Slurm names folders by job id
        for name, job in self._jobs.items():
            if job == job_id and (node_dir / name).is_dir():
                return name
        try:
            with os.scandir(node_dir) as it:
                new = [e.name for e in it if SLUID_RE.fullmatch(e.name) and
                       e.name not in self._jobs]
        except OSError:
            return plain
        for name in new:
            if self.job_of(layout, name) == job_id:
                return name
        return plain

    def keep(self, names: Iterable[str]) -> None:
        """Forget the SLUIDs whose folders are gone (``names``: the node folder's now)."""
        now = set(names)
        for name in [n for n in self._jobs if n not in now]:
            del self._jobs[name]


def slurmstepd_processes(proc: Path = Path("/proc")) -> list[StepdProcess]:
    """Every slurmstepd on this host: root's processes (slurmd starts them), every uid 0. Its
    name and title are the process's own to set, so a user's process named ``slurmstepd`` with
    the title of another user's job is no slurmstepd here. One process's files are read
    through one descriptor of its /proc folder, so a pid taken over meanwhile reads nothing.
    The kernel gives /proc/<pid> to the process's effective uid (to root when it is not
    dumpable): one stat passes over every other user's process, a fifth of what reading its
    name costs, so the scan grows with the users' processes at about 3 us each."""
    out = []
    with os.scandir(proc) as entries:
        names = [e.name for e in entries if e.name.isascii() and e.name.isdigit()
                 and _owned_by_root(e)]
    for name in names:
        seen = _stepd_at(proc, name)
        if seen is not None:
            out.append(seen[0])
    return out


def misplaced_jobs(layout: SlurmCgroupLayout, job_ids: Iterable[int],
                   stepds: Iterable[StepdProcess]) -> dict[int, str]:
    """Of ``job_ids`` (jobs Slurm runs on this node), those whose slurmstepd runs in a folder
    named for the job that is not where ``layout`` puts it: what is wrong, by job."""
    wanted = set(job_ids)
    out: dict[int, str] = {}
    for p in stepds:
        if p.job_id in wanted and p.job_id not in out and layout.misplaced(p.cgroup, p.job_id):
            out[p.job_id] = (f"job {p.job_id}: its slurmstepd (pid {p.pid}) runs in "
                             f"{p.cgroup}, not where the layout puts it ({layout.describe()})")
    return out


def process_cpuset(pid: int) -> str | None:
    """The cpuset folder of ``pid`` as /proc/<pid>/cgroup names it; None when it is gone."""
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            return cpuset_cgroup(f.read(65536).decode(errors="replace")) or ""
    except OSError:
        return None


def gather_evidence(node: str, *, cgroup_conf: Path | None = None,
                    mount: Path | None = None) -> LayoutEvidence:
    conf = read_cgroup_conf(cgroup_conf)
    mount = Path(mount or conf.get("cgroupmountpoint") or DEFAULT_MOUNT)
    try:
        mounts = tuple(parse_mountinfo(Path("/proc/self/mountinfo").read_text()))
    except OSError:
        mounts = ()
    try:
        controllers = frozenset((mount / "cgroup.controllers").read_text().split())
    except OSError:
        controllers = frozenset()
    existing = frozenset(str(c.node_dir()) for v in CgroupVersion
                         for c in candidates(node, v, mount) if c.made_folders())
    stepds: tuple[str, ...] = ()
    if not existing:
        stepds = tuple(p.cgroup for p in slurmstepd_processes() if p.cgroup)
    return LayoutEvidence(node=node, mount=mount, mounts=mounts, plugin=conf.get("cgroupplugin"),
                          v2_controllers=controllers, existing=existing, stepd_paths=stepds)


def cgroup_conf_of(slurm_conf: Path | str | None) -> Path | None:
    """cgroup.conf beside slurm.conf (Slurm reads it there): the one given, else the one this
    host's Slurm reads (a configless node's in /run/slurm/conf); None where there is none."""
    if slurm_conf:
        return Path(slurm_conf).parent / "cgroup.conf"
    conf = local_slurm_conf(None).parent / "cgroup.conf"
    return conf if conf.exists() else None


def _node_evidence(node: str, slurm_conf: Path | str | None, mount: Path | None) -> LayoutEvidence:
    conf = cgroup_conf_of(slurm_conf if slurm_conf is not None
                          else root_settings().slurm_conf)
    return gather_evidence(node, cgroup_conf=conf, mount=mount)


def discover_layout(node: str, *, slurm_conf: Path | str | None = None,
                    mount: Path | None = None) -> SlurmCgroupLayout:
    """This node's layout, from the node (see the module's docstring)."""
    return decide_layout(_node_evidence(node, slurm_conf, mount))


def discover_hierarchy(node: str, *, slurm_conf: Path | str | None = None,
                       mount: Path | None = None) -> Path:
    """The folder of the hierarchy Slurm puts this node's cpusets in, from the mount table and
    cgroup.conf alone: unlike ``discover_layout`` it needs no Slurm folder or slurmstepd yet
    (before the node's first job)."""
    ev = _node_evidence(node, slurm_conf, mount)
    return hierarchy_dir(cgroup_version_of(ev), ev.mount)


# --- the local cluster's clean-up -------------------------------------------------------------

def made_roots(node: str, *, multiple_slurmd: bool, mount: Path = DEFAULT_MOUNT) -> list[Path]:
    """The folders slurmd made for ``node`` with the given build, under either version (the
    local cluster's clean-up). Without multiple-slurmd they are the host's one slurmd's."""
    return [f for v in CgroupVersion for f in
            SlurmCgroupLayout.named(node, v, multiple_slurmd=multiple_slurmd, mount=mount)
            .made_folders()]


@dataclass
class RemovalReport:
    removed: list[Path]
    killed_pids: list[int]
    failed: list[tuple[Path, str]]


def read_pids(folder: Path | str, max_bytes: int = 1 << 20) -> list[int]:
    """The processes in a cgroup folder (its cgroup.procs, the kernel's; the first
    ``max_bytes`` of it); none when it cannot be read."""
    try:
        with open(os.path.join(folder, "cgroup.procs"), "rb") as f:
            return [int(x) for x in f.read(max_bytes).split()[:max_bytes // 2]]
    except (OSError, ValueError):
        return []


def _folders_below(root: Path, max_folders: int) -> list[Path]:
    """``root`` and the folders below it, parents first, without recursion (a job user may
    nest thousands in his v1 step folders) nor links; at most ``max_folders``."""
    out, todo = [root], [root]
    while todo and len(out) < max_folders:
        folder = todo.pop()
        try:
            with os.scandir(folder) as it:
                subs = [Path(e.path) for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        subs = subs[:max_folders - len(out)]
        out += subs
        todo += subs
    return out


def kill_any(pid: int) -> bool:
    """SIGKILL ``pid`` unchecked: for trees root alone can put processes in (the local
    cluster's clean-up of its own nodes), never for a tree a user could fill."""
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def remove_cgroup_tree(root: Path, *, timeout_s: float = 10.0, max_folders: int = 100_000,
                       kill: Callable[[int], bool] | None = kill_any,
                       sleep: Callable[[float], None] = time.sleep) -> RemovalReport:
    """Kill what still runs in ``root`` and below (each pid a folder lists, through ``kill``,
    which may decline: True when it sent), then remove the folders bottom-up (at most
    ``max_folders``: what is left is reported as failed). Without ``kill`` a folder still in
    use is left at once (reported)."""
    report = RemovalReport(removed=[], killed_pids=[], failed=[])
    if not root.is_dir() or root.is_symlink():
        return report
    folders = list(reversed(_folders_below(root, max_folders)))      # children first
    for folder in folders if kill is not None else ():
        freezer_state = folder / "freezer.state"
        if freezer_state.exists():
            try:
                freezer_state.write_text("THAWED")  # a frozen task cannot die
            except OSError:
                pass
        report.killed_pids += [pid for pid in read_pids(folder) if kill(pid)]
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
                if kill is None or time.monotonic() > deadline:
                    report.failed.append((folder, str(exc)))
                    break
                for pid in read_pids(folder):
                    kill(pid)
                sleep(0.05)
    return report
