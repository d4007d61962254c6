"""The one owner of Slurm's cgroup layout: naming per build and version, reading the paths that
/proc/<pid>/cgroup gives, and discovery from a node's evidence (real mountinfo captures)."""
import os
from pathlib import Path

import pytest

from malleable_protocol.cgroupfs import parse_mountinfo
from slurm_plugin.cgroups import (CgroupVersion, LayoutEvidence, LayoutUnknown,
                                  SlurmCgroupLayout, StepdProcess, decide_layout, misplaced_jobs,
                                  parse_stepd_title, read_cgroup_conf, slurmstepd_processes)

FIX = Path(__file__).parents[2] / "fixtures"
MOUNT = Path("/sys/fs/cgroup")
V1_MOUNTS = tuple(parse_mountinfo((FIX / "host-cgroup-v1" / "mountinfo.txt").read_text()))
# A pure cgroup v2 host (as systemd mounts it; the cgroup2 line of a Debian trixie guest).
V2_MOUNTS = tuple(parse_mountinfo(
    "25 31 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n"))
V2_CONTROLLERS = frozenset("cpuset cpu io memory hugetlb pids rdma misc".split())


def layout(node="n1", version=CgroupVersion.V1, multiple=True):
    return SlurmCgroupLayout.named(node, version, multiple_slurmd=multiple, mount=MOUNT)


@pytest.mark.parametrize("version,multiple,job_dir", [
    (CgroupVersion.V1, True, "/sys/fs/cgroup/cpuset/slurm_n1/uid_1000/job_5"),
    (CgroupVersion.V1, False, "/sys/fs/cgroup/cpuset/slurm/uid_1000/job_5"),
    (CgroupVersion.V2, True, "/sys/fs/cgroup/system.slice/n1_slurmstepd.scope/job_5"),
    (CgroupVersion.V2, False, "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_5"),
])
def test_folders_by_build_and_version(version, multiple, job_dir):
    lay = layout(version=version, multiple=multiple)
    assert str(lay.job_dir(1000, 5)) == job_dir
    assert str(lay.cpus_file(1000, 5, "step_0")) == job_dir + "/step_0/cpuset.cpus"
    assert lay.multiple_slurmd is multiple


def test_bad_names_and_ids_are_refused():
    with pytest.raises(ValueError):
        layout(node="../etc")
    with pytest.raises(ValueError):
        layout().job_dir(-1, 5)
    with pytest.raises(ValueError):
        layout().job_dir(0, 0)
    with pytest.raises(ValueError):
        layout().step_dir(0, 5, "../../x")


def test_step_and_job_of_a_proc_cgroup_path():
    v1 = "/slurm_n1/uid_1000/job_5/step_0/task_1"
    assert layout().step_of(v1, 5) == "step_0"
    assert layout().job_of(v1) == 5
    assert layout().step_of("/slurm_n1/uid_1000/job_5/step_batch", 5) == "step_batch"
    assert layout().step_of(v1, 55) is None
    assert layout(node="n2").step_of(v1, 5) is None          # another node's slurmd on this host
    assert layout(node="n").step_of(v1, 5) is None           # a prefix of the name is not it
    assert layout().step_of("/slurm_n1/uid_1000/job_5", 5) is None     # not in a step
    assert layout().job_of("/slurm_n1/uid_1000") is None
    assert layout(multiple=False).step_of("/slurm/uid_0/job_7/step_2", 7) == "step_2"
    assert layout(multiple=False).step_of(v1, 5) is None
    v2 = layout(version=CgroupVersion.V2)
    assert v2.step_of("/system.slice/n1_slurmstepd.scope/job_5/step_3/user/task_0", 5) == "step_3"
    assert v2.step_of("/system.slice/n1_slurmstepd.scope/job_5/step_3/slurm", 5) == "step_3"
    assert v2.step_of("/system.slice/n1_slurmstepd.scope/system", 5) is None
    assert v2.step_of("/user.slice/job_5/step_0", 5) is None
    plain = layout(version=CgroupVersion.V2, multiple=False)
    assert plain.job_of("/system.slice/slurmstepd.scope/job_9/step_0/user/task_0") == 9
    assert layout().another_nodes("/slurm_n7/uid_0/job_1") and not layout().another_nodes("/")
    assert not layout().another_nodes("/slurm_n1/uid_0/job_1")
    assert v2.another_nodes("/system.slice/n2_slurmstepd.scope/job_1/step_0/slurm")
    assert not plain.another_nodes("/system.slice/n2_slurmstepd.scope/job_1")   # one per host


def test_a_job_in_a_folder_the_layout_does_not_name_is_misplaced():
    stepds = [StepdProcess(10, 5, "/slurm/uid_0/job_5/step_batch"),        # production build
              StepdProcess(11, 6, "/slurm_n1/uid_0/job_6/step_0"),         # where it belongs
              StepdProcess(12, 7, "/slurm_n2/uid_0/job_7/step_0"),         # another node's
              StepdProcess(13, 8, "/"),                                     # leaving: no folder
              StepdProcess(14, 9, "/system.slice/slurmstepd.scope/job_9/step_0/slurm"),
              StepdProcess(15, None, "/slurm/uid_0/job_4/step_0")]           # not a job's title
    found = misplaced_jobs(layout(), [5, 6, 7, 8, 9, 4], stepds)
    assert sorted(found) == [5, 9]
    assert "/slurm/uid_0/job_5/step_batch" in found[5] and "slurm_n1" in found[5]
    assert misplaced_jobs(layout(), [6], stepds) == {}                      # only jobs asked about
    assert parse_stepd_title(b"slurmstepd: [5.batch]\0") == 5
    assert parse_stepd_title(b"slurmstepd: [123.0]") == 123
    assert parse_stepd_title(b"slurmstepd: [123.extern]") == 123
    for bad in (b"slurmstepd", b"slurmstepd: [x.0]", b"bash [5.0]", b"slurmstepd: [0.0]",
                b"slurmstepd: [99999999999.0]", b"", b"\xff\xfe["):
        assert parse_stepd_title(bad) is None, bad


def test_a_slurmstepd_is_a_process_of_root_not_of_its_name(tmp_path):
    """Name and title are a process's own to set: a user's process named slurmstepd with
    another job's title, in a folder named for that job, is no slurmstepd; nor is a set-uid
    program run by a user (its real uid is the user's)."""
    def process(pid: int, uids: str, title: bytes, cgroup: str) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "comm").write_bytes(b"slurmstepd\n")
        (d / "status").write_bytes(b"Name:\tslurmstepd\nUid:\t" + uids.encode() + b"\n")
        (d / "cmdline").write_bytes(title + b"\0")
        (d / "cgroup").write_text(f"4:cpuset:{cgroup}\n")
    process(10, "0\t0\t0\t0", b"slurmstepd: [5.0]", "/slurm/uid_1000/job_5/step_0")
    process(11, "1000\t1000\t1000\t1000", b"slurmstepd: [6.0]",
            "/slurm/uid_1000/job_7/step_0/job_6")
    process(12, "1000\t0\t0\t0", b"slurmstepd: [6.0]", "/slurm/uid_1000/job_7/step_0/job_6")
    # /proc/<pid> is its process's effective uid's: a folder that is not root's is passed
    # over on its owner alone, before its files are opened.
    process(13, "0\t0\t0\t0", b"slurmstepd: [8.0]", "/slurm/uid_1000/job_8/step_0")
    os.chown(tmp_path / "13", 1000, 1000)
    (tmp_path / "self").mkdir()
    assert slurmstepd_processes(tmp_path) == [
        StepdProcess(10, 5, "/slurm/uid_1000/job_5/step_0")]


def evidence(**kw) -> LayoutEvidence:
    base = dict(node="n1", mount=MOUNT, mounts=V1_MOUNTS, plugin="cgroup/v1",
                v2_controllers=frozenset(), existing=frozenset())
    return LayoutEvidence(**{**base, **kw})


def test_discovery_of_each_build_on_v1_from_the_folder_slurmd_made():
    ev = evidence(existing=frozenset({"/sys/fs/cgroup/cpuset/slurm_n1"}))
    assert decide_layout(ev) == layout()
    ev = evidence(existing=frozenset({"/sys/fs/cgroup/cpuset/slurm"}))
    assert decide_layout(ev) == layout(multiple=False)
    # Both: this node's own folder is named after it (the other is another slurmd's).
    ev = evidence(existing=frozenset({"/sys/fs/cgroup/cpuset/slurm",
                                      "/sys/fs/cgroup/cpuset/slurm_n1"}))
    assert decide_layout(ev) == layout()
    # The hybrid host's unified mount (no cpuset) does not make it v2 under autodetect.
    ev = evidence(plugin=None, existing=frozenset({"/sys/fs/cgroup/cpuset/slurm"}))
    assert decide_layout(ev).version is CgroupVersion.V1


def test_discovery_on_v2_and_from_slurmstepd_processes():
    ev = evidence(mounts=V2_MOUNTS, plugin="cgroup/v2", v2_controllers=V2_CONTROLLERS,
                  existing=frozenset({"/sys/fs/cgroup/system.slice/slurmstepd.scope"}))
    assert decide_layout(ev) == layout(version=CgroupVersion.V2, multiple=False)
    ev = evidence(mounts=V2_MOUNTS, plugin="autodetect", v2_controllers=V2_CONTROLLERS,
                  stepd_paths=("/system.slice/n1_slurmstepd.scope/job_3/step_0/slurm",))
    assert decide_layout(ev) == layout(version=CgroupVersion.V2)


def test_slurm_26_05s_sluid_named_job_folders_are_a_layout_like_any_other():
    """26.05's cgroup/v2 names a job's folder by its SLUID (cgroup_v2.c, print_sluid) unless
    CgroupJobIdPaths=yes: the node's folder is discovered as before, and which job a SLUID
    folder is, a slurmstepd in it says (test_sluid_folders.py)."""
    v2 = dict(mounts=V2_MOUNTS, plugin="cgroup/v2", v2_controllers=V2_CONTROLLERS,
              existing=frozenset({"/sys/fs/cgroup/system.slice/slurmstepd.scope"}))
    assert decide_layout(evidence(**v2)) == layout(version=CgroupVersion.V2, multiple=False)
    ev = evidence(mounts=V2_MOUNTS, plugin="autodetect", v2_controllers=V2_CONTROLLERS,
                  stepd_paths=("/system.slice/n1_slurmstepd.scope/sEKNKTV3WPV500/step_0/slurm",))
    assert decide_layout(ev) == layout(version=CgroupVersion.V2)


def test_the_hierarchy_is_known_from_the_mounts_before_any_slurm_folder():
    """What discover_hierarchy judges: the version alone (no folder, no slurmstepd yet), and the
    folder every layout of that version is under."""
    from slurm_plugin.cgroups import cgroup_version_of, hierarchy_dir
    for ev in (evidence(), evidence(mounts=V2_MOUNTS, plugin=None,
                                    v2_controllers=V2_CONTROLLERS)):
        with pytest.raises(LayoutUnknown):
            decide_layout(ev)
        version = cgroup_version_of(ev)
        assert hierarchy_dir(version, MOUNT) == (MOUNT / "cpuset" if ev.mounts == V1_MOUNTS
                                                 else MOUNT)
        for multiple in (True, False):
            assert layout(version=version, multiple=multiple).hierarchy == \
                hierarchy_dir(version, MOUNT)


@pytest.mark.parametrize("kw,says", [
    (dict(), "no Slurm cgroup folder for node n1"),                       # nothing to go by
    (dict(stepd_paths=("/slurm_n2/uid_0/job_1/step_0",)), "looked for"),  # another node's
    (dict(plugin="cgroup/v2", existing=frozenset({"/sys/fs/cgroup/cpuset/slurm_n1"})),
     "no cpuset controller"),
    (dict(mounts=V2_MOUNTS, v2_controllers=V2_CONTROLLERS, plugin="cgroup/v1"),
     "no cgroup v1 cpuset hierarchy"),
    (dict(mounts=V2_MOUNTS, plugin=None), "has no cpuset controller"),
    (dict(mounts=(), plugin=None), "neither a cgroup v1"),
    (dict(plugin="cgroup/v3"), "unknown CgroupPlugin"),
])
def test_discovery_fails_loudly_saying_what_it_looked_for(kw, says):
    with pytest.raises(LayoutUnknown, match=says):
        decide_layout(evidence(**kw))


def test_cgroup_conf_reader(tmp_path):
    conf = tmp_path / "cgroup.conf"
    conf.write_text("# comment\nCgroupPlugin=cgroup/v2  # trailing\n\nCgroupMountpoint = /cg\n")
    assert read_cgroup_conf(conf) == {"cgroupplugin": "cgroup/v2", "cgroupmountpoint": "/cg"}
    assert read_cgroup_conf(tmp_path / "missing") == {} and read_cgroup_conf(None) == {}


def test_the_agent_waits_for_slurmds_folders_then_refuses_saying_why():
    from slurm_plugin.daemon.agent import await_layout
    from slurm_plugin.node.config import AgentConfig
    t = [0.0]
    calls = []

    def discover(config):
        calls.append(t[0])
        if len(calls) < 3:
            raise LayoutUnknown("no Slurm cgroup folder for node n1: looked for X")
        return layout()
    sleep = lambda s: t.__setitem__(0, t[0] + s)   # noqa: E731
    config = AgentConfig(node="n1")
    assert await_layout(config, wait_s=10, discover=discover, clock=lambda: t[0],
                        sleep=sleep) == layout()

    def never(config):
        raise LayoutUnknown("looked for X")
    start = t[0]
    with pytest.raises(LayoutUnknown, match="looked for X"):
        await_layout(config, wait_s=1.5, discover=never, clock=lambda: t[0], sleep=sleep)
    assert 1.5 <= t[0] - start <= 2.5


def test_the_folders_slurmd_made_are_found_in_any_hierarchy(tmp_path):
    """v1: slurmd makes freezer/slurm_<node> at start, cpuset/slurm_<node> with the first job."""
    from slurm_plugin.cgroups import made_roots
    (tmp_path / "freezer" / "slurm_n1").mkdir(parents=True)
    (tmp_path / "cpuset").mkdir()
    v1 = SlurmCgroupLayout.named("n1", CgroupVersion.V1, multiple_slurmd=True, mount=tmp_path)
    assert v1.made_folders() == [tmp_path / "freezer" / "slurm_n1"]
    assert made_roots("n1", multiple_slurmd=False, mount=tmp_path) == []
    (tmp_path / "system.slice" / "slurmstepd.scope").mkdir(parents=True)
    assert made_roots("n1", multiple_slurmd=False, mount=tmp_path) == \
        [tmp_path / "system.slice" / "slurmstepd.scope"]
    assert made_roots("n2", multiple_slurmd=True, mount=tmp_path) == []
