"""Which process a pid is, as the kernel says, and signals that reach only the process checked.

A pid is a number another process may hold a moment later: between a check of /proc/<pid> and
a kill, the process can exit and its pid be given to another. ``signal_verified`` opens a pidfd
first, then checks the process, then signals through the pidfd: a process that exits in between
takes its pidfd with it (ESRCH), and the pid's next owner is never signalled. What a process
says of itself (its argv, whether it is dumpable, which sets the owner of /proc/<pid>) proves
nothing; its uids in /proc/<pid>/status do. Every read here is bounded.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Callable

from malleable_protocol.cgroupfs import parse_status_uid
from malleable_protocol.safe_io import read_bounded

STATUS_BYTES = 8192       # /proc/<pid>/status: its Uid: line is in the first few hundred bytes
CMDLINE_BYTES = 4096
PID_FILE_BYTES = 32

PidCheck = Callable[[int], bool]


def _pid(pid: object) -> int | None:
    """``pid`` when it names one process other than init (not 0, negative or a group)."""
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 1 else None


def process_uid(pid: int) -> int | None:
    """The uid process ``pid`` runs as: its real, effective, saved and file-system uids (the
    ``Uid:`` line of /proc/<pid>/status), when all four are one uid. None when they differ (a
    set-uid program, a process changing uid: nobody's, for a check), or no such process."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return parse_status_uid(f.read(STATUS_BYTES))
    except OSError:
        return None


def is_agent(pid: int) -> bool:
    """Whether ``pid`` is a root process (every uid 0) running the node's agent (``malleable
    agent``, ``python -m slurm_plugin.commands.main agent``). The command line alone could be anyone's."""
    if _pid(pid) is None or process_uid(pid) != 0:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read(CMDLINE_BYTES).split(b"\0")
    except OSError:
        return False
    return b"agent" in argv and any(b"slurm_plugin" in a or a.endswith(b"malleable")
                                    for a in argv)


def agent_pid(pid_file: Path) -> int | None:
    """The node's agent, if its pid file (root's) names a live agent (``is_agent``)."""
    try:
        pid = int(read_bounded(pid_file, PID_FILE_BYTES))
    except (OSError, ValueError):
        return None
    return pid if is_agent(pid) else None


def flock_holder(locks: str, dev: int, ino: int) -> int | None:
    """The pid holding an flock on the file (``dev``, ``ino``) in the text of /proc/locks,
    whose lines read "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF" (the device's major and
    minor numbers in hex, then the inode); waiters ("1: -> FLOCK ...") hold nothing."""
    want = (os.major(dev), os.minor(dev), ino)
    for line in locks.splitlines():
        parts = line.split()
        if len(parts) < 6 or parts[1] != "FLOCK":
            continue
        try:
            major, minor, inode = parts[5].split(":")
            if (int(major, 16), int(minor, 16), int(inode)) == want and int(parts[4]) > 0:
                return int(parts[4])
        except ValueError:
            continue
    return None


def lock_holder(lock_file: Path) -> int | None:
    """The pid holding an flock on ``lock_file`` (its device and inode), from /proc/locks."""
    try:
        st = os.stat(lock_file, follow_symlinks=False)
        with open("/proc/locks") as f:
            locks = f.read(1 << 20)
    except OSError:
        return None
    return flock_holder(locks, st.st_dev, st.st_ino)


def signal_verified(pid: int, sig: int, check: PidCheck) -> bool:
    """Send ``sig`` to ``pid`` only when ``check(pid)`` holds of the very process signalled: a
    pidfd is opened first, the check runs, the signal goes through the pidfd. True when sent;
    False (nothing sent) when there is no such process, the check fails (or raises OSError), the
    process exited after the pidfd was opened (its pid perhaps someone else's by now), or this
    kernel has no pidfds (fail closed: never a bare kill)."""
    if _pid(pid) is None:
        return False
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if not check(pid):
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:        # ProcessLookupError: it exited after the pidfd was opened
        return False
    finally:
        os.close(fd)
