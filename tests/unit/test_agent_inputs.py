"""Untrusted inputs of the agent, and its behaviour when Slurm does not answer."""
import json

import pytest

from slurm_plugin.coscheduler.config import AgentConfig
from slurm_plugin.coscheduler.reconciler import Reconciler, job_spec_and_request
from slurm_plugin.coscheduler.request import MalleableSpec
from slurm_plugin.coscheduler.telemetry_reader import (MAX_BYTES, parse_status, read_job_ranks,
                                                       status_dir)
from slurm_plugin.runner import CommandError
from slurm_plugin.slurm.model import Job, JobState

GOOD = {"pid": 10, "rank": 0, "intra_active": 2, "intra_pool": 4, "steps_per_s": {"2": 3.5}}


def test_parse_status_accepts_a_real_record():
    st = parse_status(json.dumps(GOOD).encode())
    assert st.steps_per_s == {2: 3.5} and st.intra_active == 2


@pytest.mark.parametrize("bad", [
    b"x" * (MAX_BYTES + 1), b"[]", b"not json",
    json.dumps({**GOOD, "pid": -1}).encode(), json.dumps({**GOOD, "intra_active": 0}).encode(),
    json.dumps({**GOOD, "intra_active": True}).encode(),
    json.dumps({**GOOD, "steps_per_s": {"two": 1.0}}).encode(),
    json.dumps({**GOOD, "steps_per_s": {"2": "fast"}}).encode(),
    json.dumps({**GOOD, "steps_per_s": {str(i): 1.0 for i in range(300)}}).encode(),
])
def test_parse_status_refuses(bad):
    with pytest.raises(ValueError):
        parse_status(bad)


def test_read_job_ranks_skips_bad_files_links_and_strangers(tmp_path):
    d = status_dir(tmp_path, 5)
    d.mkdir()
    (d / "rank_0.json").write_text(json.dumps(GOOD))
    (d / "rank_1.json").write_text("garbage")
    (d / "rank_2.json").symlink_to("/etc/passwd")
    (d / "rank_3.json").write_text(json.dumps({**GOOD, "pid": 11}))
    got = read_job_ranks(tmp_path, 5, "n1", check_pid=lambda pid, job, node: pid == 10)
    assert [r.pid for r in got] == [10]           # 11 is not in the job's cgroup
    for bad in (0, -1, "5/../x", True):
        with pytest.raises(ValueError):
            status_dir(tmp_path, bad)


def _job(comment="", admin=""):
    return Job(job_id=1, name="x", user="u", uid=1, state=JobState.RUNNING, partition="p",
               nodes=("n1",), num_cpus=1, comment=comment, admin_comment=admin)


def test_spec_only_from_admin_comment():
    # A user can write Comment, not AdminComment: bounds in Comment alone make nothing malleable.
    assert job_spec_and_request(_job(comment="malleable:min=1,max=8")) == (None, None)
    assert job_spec_and_request(_job(admin="malleable:min=1,max=8,weight=1")) == \
        (MalleableSpec(1, 8, 1), None)
    spec, req = job_spec_and_request(_job("malleable:cpus=3", "malleable:min=1,max=8,weight=1"))
    assert (spec, req) == (MalleableSpec(1, 8, 1), 3)
    # A malformed request changes nothing.
    assert job_spec_and_request(_job("malleable:cpus=x", "malleable:min=2,max=4,weight=1")) == \
        (MalleableSpec(2, 4, 1), None)


class Unreachable:
    def nodes(self):
        raise CommandError(["sinfo"], 1, "Unable to contact slurm controller")

    def jobs(self, **kw):
        raise AssertionError("not reached")


class NoTouch:
    def current(self, *a):
        raise AssertionError("the cgroups must not be read or written")

    apply = current


def test_slurmctld_unreachable_keeps_cpusets_and_backs_off(tmp_path):
    cfg = AgentConfig(node="n1", state_dir=tmp_path, status_base=tmp_path / "s", interval_s=0.1)
    rec = Reconciler(cfg, Unreachable(), NoTouch())
    result = rec.cycle()
    assert result.plan is None and "Unable to contact" in result.errors[0]
    waits = []

    class Wake:
        def wait(self, t):
            waits.append(t)

        def clear(self):
            pass

    rec.run(lambda: len(waits) >= 5, Wake())
    assert waits == [0.2, 0.4, 0.8, 1.0, 1.0]   # doubling, capped at 10 intervals
