"""Each job's record folder (``RunLayout.job_dir``) is a file system of its own: a tmpfs sized
for its records (1,024 records of at most 16 KiB, ``ranks.MAX_RANK_FILES``), owned by the job's
user. A user who fills it fills only his job's folder, never the /run file system where root's
ledger, lock and logs live; and the Epilog removes it whole by unmounting, without walking a
tree the user built."""
from __future__ import annotations

import os
from pathlib import Path

from malleable_protocol.runner import CommandRunner, run_command

JOB_FS_BYTES = 16 << 20
JOB_FS_INODES = 2048


def mount_job_fs(folder: Path, uid: int, gid: int, *, runner: CommandRunner = run_command) -> None:
    """Mount the job's tmpfs on ``folder`` (made by root in root's jobs folder: no path a user
    can swap). A folder that is already a mount point (a requeued job's) is kept."""
    if os.path.ismount(folder):
        return
    runner(["mount", "-t", "tmpfs", "-o",
            f"size={JOB_FS_BYTES},nr_inodes={JOB_FS_INODES},mode=0700,uid={int(uid)},"
            f"gid={int(gid)},nosuid,nodev,noexec", "malleable-job", str(folder)], timeout=10)


def unmount_job_fs(folder: Path, *, runner: CommandRunner = run_command) -> bool:
    """Unmount the job's tmpfs (lazily: a process left in it never blocks the Epilog); False
    when ``folder`` is not a mount point."""
    if not os.path.ismount(folder):
        return False
    runner(["umount", "--lazy", str(folder)], timeout=10)
    return True
