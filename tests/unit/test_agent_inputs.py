"""Untrusted inputs of the agent: rank records in a job user's folder, and Slurm's comments."""
import json
import os

import pytest

from malleable_protocol import RankStatus, RunLayout
from slurm_plugin.cgroups import CgroupVersion, SlurmCgroupLayout, process_cpuset
from slurm_plugin.coscheduler.ranks import job_step_of, read_job_ranks
from slurm_plugin.coscheduler.request import MalleableSpec, spec_and_request

UID = 4321
N1 = SlurmCgroupLayout.named("n1", CgroupVersion.V1, multiple_slurmd=True)
GOOD = dict(pid=10, rank=0, local_rank=0, local_size=1, intra_active=2, intra_pool=4,
            inter_active=2, inter_pool=4, steps_per_s={2: 3.5})


def job_folder(tmp_path, job_id=5, owner=UID):
    lay = RunLayout(tmp_path)
    d = lay.job_dir(job_id)
    d.mkdir(parents=True)
    os.chown(d, owner, owner)
    return lay, d


def put(d, name, data: bytes, owner=UID):
    (d / name).write_bytes(data)
    os.chown(d / name, owner, owner)


def test_read_job_ranks_skips_bad_files_links_fifos_strangers_and_other_owners(tmp_path):
    lay, d = job_folder(tmp_path)
    put(d, "rank_0.json", RankStatus(**GOOD).encode())
    put(d, "rank_1.json", b"garbage")
    (d / "rank_2.json").symlink_to("/etc/passwd")
    put(d, "rank_3.json", RankStatus(**{**GOOD, "pid": 11, "rank": 3}).encode())
    os.mkfifo(d / "rank_4.json")
    put(d, "rank_5.json", RankStatus(**{**GOOD, "rank": 5}).encode(), owner=0)  # not the user's
    put(d, "rank_6.json", b'{"pid":' * 4000)                                   # deep nesting
    put(d, "target-n1.json", b'{"cpus": "0"}')                                 # not a record
    got = read_job_ranks(lay, 5, UID, N1,
                         step_of=lambda pid, job, node, uid: "step_0" if pid == 10 else None)
    assert [(r.pid, r.rank, r.step) for r in got] == [(10, 0, "step_0")]   # 11: not in the job


def test_a_folder_someone_else_made_is_not_read(tmp_path):
    lay, d = job_folder(tmp_path, owner=999)      # e.g. planted ahead of the job
    put(d, "rank_0.json", RankStatus(**GOOD).encode(), owner=999)
    assert read_job_ranks(lay, 5, UID, N1, step_of=lambda *a: "step_0") == ()
    lay2 = RunLayout(tmp_path / "other")
    (tmp_path / "other" / "jobs").mkdir(parents=True)
    (tmp_path / "other" / "jobs" / "job_5").symlink_to(d)    # a link in place of the folder
    assert read_job_ranks(lay2, 5, 999, N1, step_of=lambda *a: "step_0") == ()


def test_spec_only_from_admin_comment():
    # A user can write Comment, not AdminComment: bounds in Comment alone make nothing malleable.
    assert spec_and_request("", "malleable:min=1,max=8") == (None, None)
    assert spec_and_request("malleable:min=1,max=8,weight=1", "") == (MalleableSpec(1, 8, 1), None)
    assert spec_and_request("malleable:min=1,max=8,weight=1", "malleable:cpus=3") == \
        (MalleableSpec(1, 8, 1), 3)
    # A malformed request changes nothing.
    assert spec_and_request("malleable:min=2,max=4,weight=1", "malleable:cpus=x") == \
        (MalleableSpec(2, 4, 1), None)


def test_the_step_of_a_process_is_read_from_its_cpuset_folder():
    # This test process is in no Slurm job; a pid that does not exist has no folder.
    assert job_step_of(os.getpid(), 5, N1, os.getuid()) is None
    assert process_cpuset(2**22 + 12345) is None
