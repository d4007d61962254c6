"""Readers of what the kernel says about cgroups and processes: ``/proc/<pid>/cgroup``,
``/proc/<pid>/mountinfo`` and the ``Uid:`` line of ``/proc/<pid>/status``. Pure parsers: root's
agent (over any process) and a job's ranks (over themselves) both read them. The files are
written by the kernel, not by users."""
from __future__ import annotations

import re
from pathlib import Path


def parse_status_uid(raw: bytes) -> int | None:
    """The one uid a process runs as, from its /proc/<pid>/status: its real, effective, saved
    and file-system uids when all four are one; None when they differ (a set-uid program, a
    process changing uid) or the line is missing."""
    for line in raw.splitlines():
        if line.startswith(b"Uid:"):
            try:
                uids = {int(u) for u in line.split()[1:]}
            except ValueError:
                return None
            return uids.pop() if len(uids) == 1 else None
    return None


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup to {controller: path}; cgroup v2's unified entry is keyed ""."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def cpuset_cgroup(text: str) -> str | None:
    """The folder whose CPUs bind a process, from its /proc/<pid>/cgroup: the cpuset
    controller's (v1), else the unified one (v2); None when neither is listed."""
    groups = parse_proc_cgroup(text)
    return groups.get("cpuset", groups.get(""))


def parse_cgroup_mount_roots(mountinfo: str, mount: Path) -> dict[str, str]:
    """Which cgroup folder each cgroup filesystem below ``mount`` shows at its mount point, from
    /proc/<pid>/mountinfo, keyed as /proc/<pid>/cgroup keys controllers' folders ("cpuset",
    "cpu,cpuacct"; "" for v2's unified one at ``mount`` itself). On a host every root is "/";
    in a Docker container on cgroup v1 (no cgroup namespace) it is the container's own folder,
    "/docker/<id>", mounted at /sys/fs/cgroup/<controller>, while /proc/self/cgroup still
    names the full path."""
    out: dict[str, str] = {}
    base = str(mount).rstrip("/")
    for m in parse_mountinfo(mountinfo):
        if m.fstype == "cgroup2" and m.point == base:
            out[""] = m.root
        elif m.fstype in ("cgroup", "cgroup2") and m.point.startswith(base + "/"):
            out[m.point[len(base) + 1:]] = m.root
    return out


class Mount:
    """One line of mountinfo: the folder of the file system it shows (``root``), where
    (``point``), the file system type and its super options (a v1 cgroup's controllers)."""

    __slots__ = ("root", "point", "fstype", "super_options", "source")

    def __init__(self, root: str, point: str, fstype: str, super_options: frozenset[str],
                 source: str = ""):
        self.root, self.point, self.fstype, self.super_options = root, point, fstype, super_options
        self.source = source

    def __repr__(self) -> str:
        return f"Mount({self.point} {self.fstype} {','.join(sorted(self.super_options))})"


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def unescape_mount_field(field: str) -> str:
    """A path as mountinfo writes it: space, tab, newline and backslash as octal escapes."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """/proc/<pid>/mountinfo (proc(5)); malformed lines are skipped."""
    out = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 2:
            continue
        opts = frozenset(rest[2].split(",")) if len(rest) > 2 else frozenset()
        out.append(Mount(unescape_mount_field(fields[3]), unescape_mount_field(fields[4]),
                         rest[0], opts, unescape_mount_field(rest[1])))
    return out
