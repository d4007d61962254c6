"""Untrusted inputs of the agent: rank records in a job user's folder, and Slurm's comments."""
import json
import os
import signal

import pytest

from malleable_protocol import ProtocolError, RankStatus, RunLayout
from slurm_plugin.cgroups import CgroupVersion, SlurmCgroupLayout, process_cpuset
from slurm_plugin.node.ranks import job_step_of, read_job_ranks
from malleable_policy.request import MalleableSpec, spec_and_request

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


def test_each_rank_carries_the_reload_signal_its_record_names(tmp_path):
    lay, d = job_folder(tmp_path)
    put(d, "rank_0.json", RankStatus(**GOOD, reload_signal=signal.SIGRTMIN + 3).encode())
    put(d, "rank_1.json", RankStatus(**{**GOOD, "rank": 1}, reload_signal=None).encode())
    older = json.loads(RankStatus(**{**GOOD, "rank": 2}).encode())
    del older["reload_signal"]                         # a runtime from before the field
    put(d, "rank_2.json", json.dumps(older).encode())
    put(d, "rank_3.json", json.dumps({**older, "rank": 3, "reload_signal": 9}).encode())
    got = read_job_ranks(lay, 5, UID, N1, step_of=lambda *a: "step_0")
    assert [(r.rank, r.reload_signal) for r in got] == [
        (0, signal.SIGRTMIN + 3), (1, None), (2, signal.SIGUSR1)]      # 3 named SIGKILL


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


def test_one_jobs_input_is_confined_to_that_job(tmp_path):
    """The failure boundary: a job whose records cost more than their budget, or whose cgroup
    has folders Slurm did not make, is held to its allocation (its fault); the other job is
    read and lent the idle cores as usual, and the cycle itself does not fail."""
    from slurm_plugin.node.cgroup_actuator import CgroupJob
    from slurm_plugin.node.ledger import Ledger
    from malleable_policy.model import Policy
    from slurm_plugin.node.observe import NodeObserver
    from malleable_policy.decide import decide
    from slurm_plugin.node.ranks import RankReader
    from slurm_plugin.feed import FeedJob, NodeFeed
    from ..fakes import FakeCgroups, FakeFeed
    S = frozenset
    lay = RunLayout(tmp_path)
    for job, n, owner in ((5, 300, UID), (6, 1, UID + 1)):
        d = lay.job_dir(job)
        d.mkdir(parents=True)
        os.chown(d, owner, owner)
        for r in range(n):     # job 5: 300 records of the CPU-list bomb's size
            put(d, f"rank_{r}.json", RankStatus(**{**GOOD, "rank": r}).encode() if n == 1 else
                RankStatus(**{**GOOD, "rank": r}).encode()[:-1] +
                b',"allowed_cpus":"' + b"0-1," * 1000 + b'1"}', owner=owner)
    spec = MalleableSpec(1, None)
    feed = NodeFeed("n1", 8, (FeedJob(5, UID, "u", S({0, 1}), ("n1",), spec),
                              FeedJob(6, UID + 1, "v", S({2, 3}), ("n1",), spec),
                              FeedJob(7, UID, "u", S({4}), ("n1",), spec)))
    cg = {5: CgroupJob(UID, 5, S({0, 1}), {"step_0": S({0, 1})}),
          6: CgroupJob(UID + 1, 6, S({2, 3}), {"step_0": S({2, 3})}),
          7: CgroupJob(UID, 7, S({4}), {"step_0": S({4})}, foreign=("step_0/mi\nne\x1b[2J",))}
    reader = RankReader(max_bytes=64 * 1024, step_of=lambda *a: "step_0")
    obs = NodeObserver("n1", lay, FakeFeed(feed), FakeCgroups(cg), read_ranks=reader,
                       wall=lambda: 1000.0)
    snap = obs.observe(Ledger())
    assert "InputBudgetExceeded" in snap.job(5).fault and not snap.job(5).ranks
    # The folder's name is its user's: bound for root's logs and terminal, it is escaped.
    assert snap.job(7).fault == "folders Slurm did not make below its cgroup: step_0/mi\\nne\\x1b[2J"
    assert snap.job(6).fault is None and len(snap.job(6).ranks) == 1
    assert reader.spent(UID)[0] <= 64 * 1024 + 16384
    plan = decide(snap, Policy.LEND_IDLE)
    assert plan.targets[5] == {0, 1} and plan.targets[7] == {4}
    assert len(plan.targets[6]) == 5          # every idle core: 2, 3 and 5-7
    assert len(snap.faults) == 2


def test_the_read_budget_is_one_users_for_all_his_jobs(tmp_path):
    """Issue 40, bounds per user: k jobs of one user cost root one budget a cycle, not k. His
    second job is held once the first spent it; another user's job is read."""
    from slurm_plugin.node.ranks import InputBudgetExceeded, RankReader
    lay = RunLayout(tmp_path)
    bomb = (RankStatus(**GOOD).encode()[:-1] + b',"allowed_cpus":"' +
            ",".join(str(2 * i) for i in range(700)).encode() + b'"}')
    for job, owner in ((5, UID), (6, UID), (7, UID + 1)):
        d = lay.job_dir(job)
        d.mkdir(parents=True)
        os.chown(d, owner, owner)
        for r in range(40 if owner == UID else 1):
            put(d, f"rank_{r}.json", bomb if owner == UID else RankStatus(**GOOD).encode(),
                owner=owner)
    reader = RankReader(max_bytes=1 << 30, max_cpu_s=1e9, step_of=lambda *a: "step_0")
    reader(lay, 5, UID, N1)
    one_job = reader.spent(UID)
    reader.begin_cycle()
    reader.max_bytes = one_job[0] * 3 // 2      # room for one such job's bytes, not two
    reader(lay, 5, UID, N1)
    with pytest.raises(InputBudgetExceeded, match="all his jobs"):
        reader(lay, 6, UID, N1)
    assert len(reader(lay, 7, UID + 1, N1)) == 1


def test_the_read_budget_bounds_root_cpu_on_a_job_of_1024_hostile_records(tmp_path):
    """The worst a job's folder can cost one cycle: 1,024 records at the size limit, each a
    valid record carrying CPU lists at their limit. The CPU time is measured with the real
    thread clock; the budget stops the read at about its 20 ms (plus one record)."""
    import time
    lay, d = job_folder(tmp_path)
    bomb = (RankStatus(**GOOD).encode()[:-1] + b',"allowed_cpus":"' +
            ",".join(str(2 * i) for i in range(700)).encode() + b'","share_cpus":"' +
            ",".join(str(2 * i) for i in range(700)).encode() + b'"}')
    assert len(bomb) < 16384
    RankStatus.decode(bomb)          # valid: the reader pays its whole decode
    for r in range(1024):
        put(d, f"rank_{r}.json", bomb)
    from slurm_plugin.node.ranks import InputBudgetExceeded, RankReader
    reader = RankReader(max_bytes=1 << 30, step_of=lambda *a: "step_0")
    t0 = time.thread_time()
    with pytest.raises(InputBudgetExceeded):
        reader(lay, 5, UID, N1)
    used = time.thread_time() - t0
    print(f"\n1,024 hostile records: read stopped after {reader.spent(UID)[0]} bytes, "
          f"{used * 1000:.1f} ms CPU")
    assert used < 0.05
    with pytest.raises(InputBudgetExceeded):       # the rest of the cycle: nothing more spent
        reader(lay, 5, UID, N1)
    reader.begin_cycle()
    assert reader.spent(UID) == (0, 0.0)


def test_the_budget_is_checked_after_each_decode_too(tmp_path, monkeypatch):
    """One record whose decode alone costs more than the budget (a parser's worst case) stops
    the read as it ends, even when the record is refused and is the folder's last."""
    from slurm_plugin.node import ranks
    lay, d = job_folder(tmp_path)
    put(d, "rank_0.json", b'"' + b'\\"' * 100)
    clock = [0.0]

    def slow_refusal(raw):
        clock[0] += 0.05          # the decode's CPU, on the reader's clock
        raise ProtocolError("not JSON")
    monkeypatch.setattr(ranks.RankStatus, "decode", slow_refusal)
    reader = ranks.RankReader(cpu_clock=lambda: clock[0], step_of=lambda *a: "step_0")
    with pytest.raises(ranks.InputBudgetExceeded):
        reader(lay, 5, UID, N1)
    assert reader.spent(UID)[1] == pytest.approx(0.05)


def test_a_records_folder_its_user_mounted_on_is_not_opened(tmp_path):
    """With the user's FUSE mount on his job's folder, root's open would get EACCES, or with
    allow_other wait on the user's file system: the kernel's mount table says so first."""
    from malleable_protocol.cgroupfs import Mount
    from slurm_plugin.node.ranks import FolderMountedOver, RankReader
    lay, d = job_folder(tmp_path)
    put(d, "rank_0.json", RankStatus(**GOOD).encode())
    table = [Mount("/", str(d), "tmpfs", frozenset(), "malleable-job")]
    reader = RankReader(step_of=lambda *a: "step_0", mounts=lambda: table)
    assert len(reader(lay, 5, UID, N1)) == 1
    table.append(Mount("/", str(d), "fuse.sshfs", frozenset(), "malleable-job"))
    assert len(reader(lay, 5, UID, N1)) == 1        # the table is read once a cycle
    reader.begin_cycle()
    with pytest.raises(FolderMountedOver, match="fuse.sshfs"):
        reader(lay, 5, UID, N1)


def test_the_node_lock_is_roots_alone(tmp_path):
    """flock needs only a descriptor: a lock file a job user can open is a lock he can hold."""
    from slurm_plugin.node.reconciler import node_lock
    lock = tmp_path / "agent-n1.lock"
    lock.write_text("")
    lock.chmod(0o644)                     # as an earlier version left it
    with node_lock(lock, 1.0):
        assert lock.stat().st_mode & 0o777 == 0o600
    (tmp_path / "link.lock").symlink_to(lock)
    with pytest.raises(OSError):
        with node_lock(tmp_path / "link.lock", 1.0):
            pass


def test_job_faults_are_counted_in_the_metrics():
    from slurm_plugin.daemon.metrics import AgentMetrics
    from malleable_policy.model import JobView, NodeSnapshot, Policy
    from malleable_policy.decide import decide
    from slurm_plugin.node.reconciler import CycleResult
    S = frozenset
    jobs = (JobView(5, UID, "u", S({0}), S({0}), spec=MalleableSpec(1, None), fault="over budget"),
            JobView(6, UID, "u", S({1}), S({1}), spec=MalleableSpec(1, None)))
    snap = NodeSnapshot("n1", S(range(4)), jobs)
    metrics = AgentMetrics("n1", per_job=True)
    metrics.observe(CycleResult(snapshot=snap, plan=decide(snap, Policy.LEND_IDLE)))
    assert metrics.registry.get_sample_value("malleable_job_faults", {"node": "n1"}) == 1
    assert metrics.registry.get_sample_value("malleable_job_cores",
                                             {"node": "n1", "job": "5", "kind": "current"}) == 1


def test_the_hooks_log_takes_one_line_per_note_whatever_it_quotes(tmp_path):
    """A note quoting what a user chose (a folder name, a file system type) is one line of
    printable ASCII: a newline in it cannot forge a second entry."""
    from slurm_plugin.node.config import AgentConfig
    from slurm_plugin.node.safety import note
    from malleable_protocol.errors import printable
    config = AgentConfig(node="n1", state_dir=tmp_path)
    note(config, "job 5: fault: a\n2026-11-28T00:00:00 job 6 start: ok\x1b[2J\xe9")
    lines = (tmp_path / "hooks-n1.log").read_text().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        "job 5: fault: a\\n2026-11-28T00:00:00 job 6 start: ok\\x1b[2J\\xe9")
    assert printable("x" * 500) == "x" * 400 and len(printable("\x01" * 500)) == 400


def test_walking_a_users_cgroup_folders_is_charged_to_his_budget(tmp_path):
    """Issue 40, bounded per user: the CPU the scan spent on a job's folders (his tasks and
    folders make them) counts against the same budget as his records; a job whose folders
    cost the whole budget is held to its allocation without its records being read."""
    from slurm_plugin.node.cgroup_actuator import CgroupJob
    from slurm_plugin.node.ledger import Ledger
    from slurm_plugin.node.observe import NodeObserver
    from slurm_plugin.node.ranks import RankReader
    from slurm_plugin.feed import FeedJob, NodeFeed
    from ..fakes import FakeCgroups, FakeFeed
    S = frozenset
    lay = RunLayout(tmp_path)
    d = lay.job_dir(5)
    d.mkdir(parents=True)
    os.chown(d, UID, UID)
    put(d, "rank_0.json", RankStatus(**GOOD).encode(), owner=UID)
    spec = MalleableSpec(1, None)
    feed = NodeFeed("n1", 4, (FeedJob(5, UID, "u", S({0, 1}), ("n1",), spec),))
    for scan_cpu_s, held in ((0.001, False), (0.025, True)):
        cg = {5: CgroupJob(UID, 5, S({0, 1}), {"step_0": S({0, 1})}, scan_cpu_s=scan_cpu_s)}
        reader = RankReader(max_cpu_s=0.02, step_of=lambda *a: "step_0")
        reader.begin_cycle()
        snap = NodeObserver("n1", lay, FakeFeed(feed), FakeCgroups(cg), read_ranks=reader,
                            wall=lambda: 1000.0).observe(Ledger())
        job = snap.job(5)
        assert (job.fault is not None and "InputBudgetExceeded" in job.fault) == held, job.fault
        assert len(job.ranks) == (0 if held else 1)
        assert reader.spent(UID)[1] >= scan_cpu_s


def test_the_sites_input_cpu_budget_reaches_the_reader_and_is_bounded(tmp_path):
    """agent.json's input_cpu_budget_ms (a slow or emulated node needs more than 20 ms) is the
    budget of the reader the node's reconciler reads records with; nonsense is refused."""
    from slurm_plugin.node.config import AgentConfig
    from slurm_plugin.node.wiring import make_reconciler
    from slurm_plugin.topology import CpuNumbering, SlurmLayout
    base = AgentConfig.under(tmp_path, node="n1")
    assert base.input_cpu_budget_ms == 20.0
    config = AgentConfig.from_json(json.dumps({**json.loads(base.to_json()),
                                               "input_cpu_budget_ms": 250}))
    numbering = CpuNumbering(linux_of=(0, 1), cores=(frozenset({0}), frozenset({1})),
                             layout=SlurmLayout(1, 2, 1))
    reconciler = make_reconciler(config, N1, numbering=numbering)
    assert reconciler.rank_reader.max_cpu_s == pytest.approx(0.25)
    for bad in (0, 5000, True, "20"):
        with pytest.raises(ValueError, match="input_cpu_budget_ms"):
            AgentConfig.from_json(json.dumps({**json.loads(base.to_json()),
                                              "input_cpu_budget_ms": bad}))
