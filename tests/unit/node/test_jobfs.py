"""A job's record folder as a tmpfs of its own (real mounts; the suite runs as root)."""
import errno
import os
from pathlib import Path

import pytest

from malleable_protocol.cgroupfs import parse_mountinfo
from slurm_plugin.node.jobfs import (JOB_FS_BYTES, detach_job_fs, mount_job_fs,
                                     mounted_over, unmount_job_fs)
from malleable_protocol.runner import CommandError


def test_a_user_fills_only_his_jobs_folder_and_the_epilog_unmounts_it(tmp_path):
    folder = tmp_path / "job_5"
    folder.mkdir()
    mount_job_fs(folder, 4242, 4243)
    try:
        st = folder.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (4242, 4243, 0o700)
        (folder / "old").write_bytes(b"x")
        mount_job_fs(folder, 4242, 4243)          # a requeued job: a fresh one
        assert os.listdir(folder) == []
        with pytest.raises(OSError) as err:
            with open(folder / "fill", "wb") as f:
                for _ in range(JOB_FS_BYTES // (1 << 20) + 2):
                    f.write(b"x" * (1 << 20))
        assert err.value.errno == errno.ENOSPC
        (tmp_path / "beside").write_bytes(b"y" * (1 << 20))     # outside: unaffected
    finally:
        assert unmount_job_fs(folder)
    assert os.listdir(folder) == [] and not unmount_job_fs(folder)
    folder.rmdir()


def test_logs_are_capped(tmp_path):
    from malleable_protocol.safe_io import append_capped
    log = tmp_path / "events.jsonl"
    for i in range(5000):
        append_capped(log, f"line {i:06d}\n", 4096)
    assert log.stat().st_size <= 4096 + 12 and (tmp_path / "events.jsonl.1").stat().st_size <= 4096 + 12
    assert log.read_text().splitlines()[-1] == "line 004999"
    assert (log.stat().st_mode & 0o777) == 0o600
    (tmp_path / "evil").symlink_to("/etc/passwd")
    with pytest.raises(OSError):
        append_capped(tmp_path / "evil", "x\n", 4096)


# A job's tmpfs and, on it, a bindfs its user mounted (fusermount3, no allow_other): lines of
# /proc/self/mountinfo seen on this machine, then one mounted in a folder inside, its name
# with a space.
MOUNTINFO = (
    "42 27 0:39 / /run/m/jobs/job_9 rw,relatime - tmpfs malleable-job rw,size=16384k,mode=700,"
    "uid=1001,gid=1001\n"
    "43 42 0:40 / /run/m/jobs/job_9 rw,nosuid,nodev,relatime - fuse /tmp/jf/src rw,"
    "user_id=1001,group_id=1001,default_permissions\n"
    "44 27 0:41 / /run/m/jobs/job_10 rw,relatime - tmpfs malleable-job rw,size=16384k\n"
    "45 44 0:42 / /run/m/jobs/job_10/a\\040b rw,relatime - fuse.bindfs malleable-job rw\n"
    "46 27 0:43 / /run/m/jobs/job_11 rw,relatime - tmpfs malleable-job rw,size=16384k\n"
    "47 27 0:44 / /run/m/jobs2/job_12 rw,relatime - fuse x rw\n")


def test_folders_a_user_mounted_on_or_in_are_named_from_mountinfo():
    over = mounted_over(Path("/run/m/jobs"), parse_mountinfo(MOUNTINFO))
    assert sorted(over) == ["job_10", "job_9"]
    assert "fuse on '/run/m/jobs/job_9'" in over["job_9"]
    assert "fuse.bindfs on '/run/m/jobs/job_10/a b'" in over["job_10"]


def test_detach_takes_every_mount_on_the_folder_and_gives_up_on_one_that_comes_back():
    mounts = parse_mountinfo(MOUNTINFO)
    calls = []

    def runner(argv, **kw):
        calls.append(argv)
        for i in range(len(mounts) - 1, -1, -1):     # the top one at that point goes
            if mounts[i].point == argv[-1]:
                del mounts[i]
                break
    assert detach_job_fs(Path("/run/m/jobs/job_9"), runner=runner, mounts=lambda: mounts) == 2
    assert calls == [["umount", "--lazy", "/run/m/jobs/job_9"]] * 2
    assert not unmount_job_fs(Path("/run/m/jobs/job_9"), runner=runner, mounts=lambda: mounts)
    again = parse_mountinfo(MOUNTINFO)[:1]
    with pytest.raises(CommandError, match="mounts on it again"):
        detach_job_fs(Path("/run/m/jobs/job_9"), runner=lambda argv, **kw: None,
                      mounts=lambda: again)
