import os
from pathlib import Path

import pytest

from slurm_plugin.cluster.spec import (ClusterSpec, HostTopology, SpecError, parse_slurmd_c,
                                       render_cgroup_conf, render_slurm_conf,
                                       render_slurmdbd_conf)

GOLDEN = Path(__file__).parents[2] / "golden"
FIX = Path(__file__).parents[2] / "fixtures" / "slurm-22.05"


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs; UPDATE_GOLDEN=1 rewrites it after review"


def spec(**kw) -> ClusterSpec:
    return ClusterSpec(root=Path("/srv/mc"), hostname="vm",
                       topology=HostTopology(cpus=2, cores_per_socket=2), **kw)


def test_slurm_conf_golden():
    golden("slurm.conf", render_slurm_conf(spec()))
    golden("cgroup.conf", render_cgroup_conf(spec()))


def test_slurm_conf_with_hooks_and_override_golden():
    s = spec(nodes=2, cpus_per_node=8).with_hooks(
        prolog=Path("/srv/hooks/prolog.sh"), epilog=Path("/srv/hooks/epilog.sh"),
        job_submit_lua=Path("/srv/hooks/job_submit.lua"))
    golden("slurm_hooks.conf", render_slurm_conf(s))


def test_a_cluster_with_accounting_golden():
    """slurm.conf points at slurmdbd (and the cluster's munged for it); slurmdbd.conf at the
    cluster's MariaDB on loopback; their two ports are the cluster's too."""
    s = spec(nodes=2, port_base=20000, accounting=True)
    golden("slurm_accounting.conf", render_slurm_conf(s))
    golden("slurmdbd.conf", render_slurmdbd_conf(s, "pw"))
    assert s.ports["slurmdbd"] == 20098 and s.ports["mariadb"] == 20097
    assert len(set(s.ports.values())) == len(s.ports)
    assert "slurmdbd" not in spec().ports


def test_ports_and_names():
    s = spec(nodes=3, port_base=20000, node_prefix="c")
    assert s.node_names == ["c1", "c2", "c3"]
    assert s.ports == {"slurmctld": 20000, "slurmd c1": 20001, "slurmd c2": 20002,
                       "slurmd c3": 20003, "agent metrics c1": 20100,
                       "agent metrics c2": 20101, "agent metrics c3": 20102,
                       "watcher metrics": 20099}


def test_json_roundtrip():
    s = spec().with_hooks(prolog=Path("/p"), epilog=None, job_submit_lua=None)
    assert ClusterSpec.from_json(s.to_json()) == s


@pytest.mark.parametrize("kw", [
    {"name": "bad name"}, {"name": "x;rm"}, {"nodes": 0}, {"nodes": 65}, {"port_base": 80},
    {"node_prefix": "../x"}, {"cpus_per_node": 0},
])
def test_bad_spec_refused(kw):
    with pytest.raises(SpecError):
        spec(**kw)


def test_relative_root_refused():
    with pytest.raises(SpecError):
        ClusterSpec(root=Path("relative"))


def test_parse_slurmd_c_real_output():
    topo = parse_slurmd_c((FIX / "slurmd_C.txt").read_text())
    assert topo == HostTopology(cpus=2, boards=1, sockets_per_board=1, cores_per_socket=2,
                                threads_per_core=1)
    with pytest.raises(SpecError):
        parse_slurmd_c("garbage")


def test_docker_cluster_slurm_conf_and_compose_golden():
    """docker-slurm: one host per node, each container's own munged, the controller first, a
    backup controller host beside it (the Makefile's default)."""
    from slurm_plugin.cluster.docker import DockerCluster, render_compose
    dc = DockerCluster(project="malleable-bookworm", image="malleable-slurm:bookworm",
                       host_dir=Path("/var/tmp/docker-slurm/cluster-bookworm"), nodes=2,
                       node_prefix="bw", backup=True)
    s = dc.spec(HostTopology(cpus=2, cores_per_socket=2))
    conf = render_slurm_conf(s)
    assert "NodeName=bw1 NodeHostname=bw1 NodeAddr=bw1 " in conf
    assert "SlurmctldHost=bwctl(bwctl)\nSlurmctldHost=bwctl2\n" in conf
    # Each controller host its own pid file: a shared one names another namespace's pid.
    assert "SlurmctldPidFile=/run/slurmctld.pid\n" in conf
    assert "AuthInfo=socket=/run/munge/munge.socket.2" in conf
    assert ClusterSpec.from_json(s.to_json()) == s
    golden("docker-compose.json", render_compose(dc, s.node_names))
    plain = render_slurm_conf(DockerCluster(project="p", image="i", host_dir=Path("/d"),
                                            node_prefix="bw").spec(HostTopology(cpus=2)))
    assert "SlurmctldHost=bwctl(bwctl)\nSlurmctldPort" in plain


def test_backup_controllers_need_hosts_of_their_own():
    with pytest.raises(SpecError, match="own_hosts"):
        spec(backup_controllers=("ctl2",))
    for bad in ("vm", "a b"):
        with pytest.raises(SpecError):
            spec(own_hosts=True, backup_controllers=(bad,))


def test_docker_cluster_refuses_bad_names():
    from slurm_plugin.cluster.docker import DockerCluster
    with pytest.raises(SpecError):
        DockerCluster(project="x;rm -rf", image="i", host_dir=Path("/d"))
    with pytest.raises(SpecError):
        DockerCluster(project="ok", image="i", host_dir=Path("relative"))


def test_scheduler_parameters_rendered_and_checked():
    """SchedulerParameters is written as given (none by default: Slurm's defaults), survives
    cluster.json, and refuses what would add another line or setting to slurm.conf."""
    assert "SchedulerParameters" not in render_slurm_conf(spec())
    s = spec(scheduler_parameters="bf_interval=1,bf_resolution=1,bf_continue")
    lines = render_slurm_conf(s).splitlines()
    assert "SchedulerParameters=bf_interval=1,bf_resolution=1,bf_continue" in lines
    assert ClusterSpec.from_json(s.to_json()) == s
    for bad in ("", "bf_interval=1\nNodeName=x", "bf_interval=1 PriorityType=x", "a,,b", "=1"):
        with pytest.raises(SpecError):
            spec(scheduler_parameters=bad)


def test_a_cluster_never_listens_among_linuxs_ephemeral_ports(tmp_path):
    """Any outgoing connection may take an ephemeral port, so a daemon's port there is free by
    chance (a benchmark's slurmd port was once held by a client): the cluster refuses such a
    port base before it starts anything, and says what to choose."""
    from dataclasses import replace

    from slurm_plugin.cluster.local import ClusterError, LocalCluster, ephemeral_ports
    assert ephemeral_ports("32768\t60999\n") == range(32768, 61000)
    assert ephemeral_ports("1024 65000") == range(1024, 65001)
    assert ephemeral_ports("junk") == range(32768, 61000)       # Linux's default
    live = ephemeral_ports()
    s = replace(spec(nodes=1), root=tmp_path, port_base=live.start + 100)
    with pytest.raises(ClusterError, match="ephemeral"):
        LocalCluster(s).preflight()
