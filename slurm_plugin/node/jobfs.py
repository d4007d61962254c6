"""Each job's record folder (``RunLayout.job_dir``) is a file system of its own: a tmpfs sized
for its records (1,024 records of at most 16 KiB, ``records.MAX_RANK_RECORDS``), owned by the
job's user. A user who fills it fills only his job's folder, never the /run file system where root's
ledger, lock and logs live; and the Epilog removes it whole by unmounting, without walking a
tree the user built.

The folder is the user's, so he may mount a file system of his own on it or in it (fusermount3
needs only write access to the mount point). Root then gets EACCES on it (a FUSE mount without
allow_other), or, where the site allows allow_other, a file system whose answers the user
controls and may delay forever. So what is mounted where is read from the kernel
(/proc/self/mountinfo), never by looking at the folder: root's reader does not open a job
folder something else is mounted on or in (the job's fault), and the hooks detach whatever
is mounted on the folder, which takes what is mounted below it along (MNT_DETACH).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from malleable_protocol.cgroupfs import Mount, parse_mountinfo
from malleable_protocol.runner import CommandError, CommandRunner, run_command

JOB_FS_BYTES = 16 << 20
JOB_FS_INODES = 2048
JOB_FS_SOURCE = "malleable-job"      # the device name the job's tmpfs is mounted with
# A user who mounts on his folder again as soon as it is detached (from another job of his on
# the node) is not chased forever: after this many detaches the folder is left to its job.
MAX_DETACH = 16

MountReader = Callable[[], list[Mount]]


def node_mounts() -> list[Mount]:
    with open("/proc/self/mountinfo", "rb") as f:
        return parse_mountinfo(f.read().decode(errors="replace"))


def mounted_over(jobs_dir: Path, mounts: list[Mount]) -> dict[str, str]:
    """The job folders (their names in ``jobs_dir``) with a file system on or in them other
    than the job's own tmpfs: name -> what is mounted where (for the job's fault)."""
    prefix = str(jobs_dir) + "/"
    out: dict[str, str] = {}
    for m in mounts:
        if not m.point.startswith(prefix):
            continue
        name, _, below = m.point[len(prefix):].partition("/")
        if (below or m.fstype != "tmpfs" or m.source != JOB_FS_SOURCE) and name not in out:
            out[name] = (f"its records' folder has a file system its user mounted "
                         f"({m.fstype[:32]} on {m.point[:200]!r})")
    return out


def detach_job_fs(folder: Path, *, runner: CommandRunner = run_command,
                  mounts: MountReader = node_mounts) -> int:
    """Detach every file system mounted on ``folder`` (the job's tmpfs, and whatever its user
    mounted on top), lazily: each with all that is mounted below it, and a process left in it
    never blocks the hook. The path is root's own (the jobs folder only root writes), never a
    path inside the folder, which its user could swap for a link. How many were detached;
    CommandError when something is still mounted there after ``MAX_DETACH``."""
    detached = 0
    while any(m.point == str(folder) for m in mounts()):
        if detached == MAX_DETACH:
            raise CommandError(["umount", "--lazy", str(folder)], None, "",
                               reason=f"still mounted after {MAX_DETACH} detaches (its user "
                               "mounts on it again)")
        runner(["umount", "--lazy", str(folder)], timeout=10)
        detached += 1
    return detached


def mount_job_fs(folder: Path, uid: int, gid: int, *, runner: CommandRunner = run_command,
                 mounts: MountReader = node_mounts) -> None:
    """Mount a fresh tmpfs for the job on ``folder`` (made by root in root's jobs folder: no
    path a user can swap). What was mounted there before (a requeued job's folder, a user's
    mount) is detached first."""
    detach_job_fs(folder, runner=runner, mounts=mounts)
    runner(["mount", "-t", "tmpfs", "-o",
            f"size={JOB_FS_BYTES},nr_inodes={JOB_FS_INODES},mode=0700,uid={int(uid)},"
            f"gid={int(gid)},nosuid,nodev,noexec", JOB_FS_SOURCE, str(folder)], timeout=10)


def unmount_job_fs(folder: Path, *, runner: CommandRunner = run_command,
                   mounts: MountReader = node_mounts) -> bool:
    """The Epilog's: detach all that is mounted on the job's folder; False when nothing was."""
    return detach_job_fs(folder, runner=runner, mounts=mounts) > 0
