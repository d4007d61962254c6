import signal
from pathlib import Path

import pytest

from malleable_tf import Action
from malleable_runtime.allowance import (Allowance, expand_tasks_per_node, local_rank_and_size,
                                    parse_proc_cgroup, parse_quota, share_of)
from malleable_runtime.control import (DEFAULT_RELOAD_SIGNAL, DEFAULT_SIGNALS,
                                  announced_reload_signal, parse_signal_spec, signal_name)
from malleable_runtime.telemetry import MAX_THREAD_COUNTS, StepRate


def test_usable_counts_quota():
    assert Allowance(frozenset({0, 1, 2, 3})).usable == 4
    assert Allowance(frozenset({0, 1, 2, 3}), quota_cpus=2.5).usable == 2
    assert Allowance(frozenset({0, 1}), quota_cpus=0.3).usable == 1
    assert Allowance(frozenset({0}), quota_cpus=8).usable == 1


@pytest.mark.parametrize("cpus,size,shares", [
    ({0, 1, 2, 3}, 2, [{0, 1}, {2, 3}]),
    ({0, 1, 2, 3, 4}, 2, [{0, 1, 2}, {3, 4}]),
    ({4, 6, 7}, 3, [{4}, {6}, {7}]),
    ({0, 1}, 4, [{0}, {1}, {0}, {1}]),      # fewer cores than ranks: one core each, shared
    ({0, 1, 2, 3}, 1, [{0, 1, 2, 3}]),
])
def test_share_of_splits_without_overlap(cpus, size, shares):
    got = [share_of(Allowance(frozenset(cpus)), r, size) for r in range(size)]
    assert got == shares
    if len(cpus) >= size:
        assert set().union(*got) == cpus
        assert sum(len(s) for s in got) == len(cpus)  # no core in two shares


def test_share_of_respects_quota():
    assert share_of(Allowance(frozenset({0, 1, 2, 3}), quota_cpus=2.0), 0, 1) == {0, 1}


def test_share_of_rejects_bad_rank():
    with pytest.raises(ValueError):
        share_of(Allowance(frozenset({0})), 1, 1)
    with pytest.raises(ValueError):
        share_of(Allowance(frozenset()), 0, 1)


def test_parse_proc_cgroup_v1_and_v2():
    text = ("9:name=systemd:/\n4:memory:/x\n3:cpuset:/slurm_n1/uid_0/job_5/step_0\n"
            "2:cpu,cpuacct:/docker/abc\n0::/user.slice\n")
    g = parse_proc_cgroup(text)
    assert g["cpuset"] == "/slurm_n1/uid_0/job_5/step_0"
    assert g["cpu"] == g["cpuacct"] == "/docker/abc"
    assert g[""] == "/user.slice"


@pytest.mark.parametrize("args,expected", [
    (("-1", "100000", None), None), (("150000", "100000", None), 1.5),
    ((None, None, "max 100000"), None), ((None, None, "200000 100000"), 2.0),
    ((None, None, None), None),
])
def test_parse_quota(args, expected):
    assert parse_quota(*args) == expected


def test_tasks_per_node_and_local_rank():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ValueError):
        expand_tasks_per_node("2(x)")
    assert local_rank_and_size({"OMPI_COMM_WORLD_LOCAL_RANK": "1",
                                "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}) == (1, 2)
    assert local_rank_and_size({"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "1,3",
                                "SLURM_NODEID": "1"}) == (0, 3)
    assert local_rank_and_size({}) == (0, 1)


def test_signal_spec():
    assert parse_signal_spec("USR1=reload, SIGUSR2=intra-down") == {
        signal.SIGUSR1: Action.RELOAD, signal.SIGUSR2: Action.INTRA_DOWN}
    assert parse_signal_spec("RTMIN+3=reload,sigrtmax-1=intra-up,SIGRTMIN=inter-up") == {
        signal.SIGRTMIN + 3: Action.RELOAD, signal.SIGRTMAX - 1: Action.INTRA_UP,
        signal.SIGRTMIN: Action.INTER_UP}
    last = signal.SIGRTMAX - signal.SIGRTMIN
    for bad in ["USR1", "NOPE=reload", "USR1=explode", "KILL=reload", f"RTMIN+{last + 1}=reload",
                "RTMAX+1=reload", "RTMIN-1=reload", "37=reload", "=reload", "RTMIN+=reload"]:
        with pytest.raises(ValueError):
            parse_signal_spec(bad)


def test_signal_names_and_the_announced_reload_signal():
    assert signal_name(signal.SIGRTMIN + 3) == "SIGRTMIN+3"
    assert signal_name(signal.SIGUSR1) == "SIGUSR1" and signal_name(signal.SIGRTMAX) == "SIGRTMAX"
    assert parse_signal_spec(f"{signal_name(DEFAULT_RELOAD_SIGNAL)}=reload") == DEFAULT_SIGNALS
    # The first reload signal the agent may send; none when none is mapped to reload.
    assert announced_reload_signal(parse_signal_spec("HUP=reload,RTMIN+3=reload,USR1=reload")) \
        == signal.SIGRTMIN + 3
    assert announced_reload_signal(DEFAULT_SIGNALS) == DEFAULT_RELOAD_SIGNAL
    assert announced_reload_signal(parse_signal_spec("USR2=intra-down,HUP=reload")) is None
    assert announced_reload_signal({}) is None


def test_step_rate_is_bounded_and_weighted():
    r = StepRate(alpha=0.5)
    r.record(2, 10, 1.0)
    r.record(2, 20, 1.0)
    assert r.rates[2] == 15.0
    r.record(1, 0, 1.0)  # nothing to learn from zero steps
    assert 1 not in r.rates
    for k in range(MAX_THREAD_COUNTS + 10):
        r.record(k + 10, 1, 1.0)
    assert len(r.rates) == MAX_THREAD_COUNTS


def test_cgroup_files_inside_a_docker_container_on_cgroup_v1(tmp_path):
    """Captured in a container of this host's Docker (tests/fixtures/docker_container_cgroup.txt):
    /proc/self/cgroup names /docker/<id>, which the container sees mounted at
    /sys/fs/cgroup/cpuset itself. The cpuset file is found there, so a process in a container
    follows its cpuset when `docker update` grows it (its affinity mask alone does not widen
    again once it pinned itself)."""
    from malleable_runtime.allowance import CgroupFiles, parse_cgroup_mount_roots
    text = (Path(__file__).parents[2] / "fixtures" / "docker_container_cgroup.txt").read_text()
    mountinfo = "\n".join(line for line in text.splitlines() if " - " in line)
    proc_cgroup = "\n".join(line for line in text.splitlines() if " - " not in line)
    cid = proc_cgroup.split("cpuset:")[1].split()[0]
    roots = parse_cgroup_mount_roots(mountinfo, Path("/sys/fs/cgroup"))
    assert roots["cpuset"] == cid and cid.startswith("/docker/")
    files = CgroupFiles.locate(proc_cgroup, Path("/sys/fs/cgroup"), roots)
    assert files.cpuset[0] == Path("/sys/fs/cgroup/cpuset/cpuset.effective_cpus")
    # Without the mount roots (a host's view), the full path is kept.
    host = CgroupFiles.locate(proc_cgroup, Path("/sys/fs/cgroup"))
    assert host.cpuset[0] == Path(f"/sys/fs/cgroup/cpuset{cid}/cpuset.effective_cpus")
    assert parse_cgroup_mount_roots("garbage\n1 2 3", Path("/sys/fs/cgroup")) == {}
