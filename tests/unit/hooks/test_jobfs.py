"""A job's record folder as a tmpfs of its own (real mounts; the suite runs as root)."""
import errno
import os

import pytest

from slurm_plugin.hooks.jobfs import JOB_FS_BYTES, mount_job_fs, unmount_job_fs


def test_a_user_fills_only_his_jobs_folder_and_the_epilog_unmounts_it(tmp_path):
    folder = tmp_path / "job_5"
    folder.mkdir()
    mount_job_fs(folder, 4242, 4243)
    try:
        st = folder.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (4242, 4243, 0o700)
        mount_job_fs(folder, 4242, 4243)          # a requeued job: the mount is kept
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
