"""The node's CPU numbering (slurm_plugin/topology.py): Slurm's abstract ids -> Linux's, read
from sysfs, on real machines' topologies (hwloc's test data, tests/fixtures/topology) checked
against hwloc's own logical order, and the refusals."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from malleable_protocol import format_cpu_list
from slurm_plugin.topology import (CpuNumbering, SlurmLayout, TopologyUnknown,
                                   check_against_slurm, node_numbering, read_threads)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "topology"


def write_sysfs(root: Path, files: dict[str, str]) -> tuple[Path, Path]:
    """A sysfs tree below ``root`` from {path below sys/: text}; (cpu dir, node dir)."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "devices/system/cpu", root / "devices/system/node"


def machine_files(packages: list[list[list[int]]], *, numa: list[list[int]] | None = None
                  ) -> dict[str, str]:
    """sysfs files of a machine given as packages of cores of Linux CPU ids."""
    files = {}
    every = sorted(c for p in packages for core in p for c in core)
    files["devices/system/cpu/online"] = format_cpu_list(every) + "\n"
    for pid, package in enumerate(packages):
        in_package = sorted(c for core in package for c in core)
        for cid, core in enumerate(package):
            for cpu in core:
                topo = f"devices/system/cpu/cpu{cpu}/topology"
                files[f"{topo}/physical_package_id"] = f"{pid}\n"
                files[f"{topo}/core_id"] = f"{cid}\n"
                files[f"{topo}/thread_siblings_list"] = format_cpu_list(core) + "\n"
                files[f"{topo}/core_siblings_list"] = format_cpu_list(in_package) + "\n"
    for n, cpus in enumerate(numa or []):
        files[f"devices/system/node/node{n}/cpulist"] = format_cpu_list(cpus) + "\n"
    return files


def numbering_of_files(tmp_path: Path, files: dict[str, str]) -> CpuNumbering:
    cpu_dir, node_dir = write_sysfs(tmp_path, files)
    return node_numbering(cpu_dir=cpu_dir, node_dir=node_dir)


def test_one_socket_without_hyperthreads_is_slurms_own_numbering(tmp_path):
    n = numbering_of_files(tmp_path, machine_files([[[0], [1], [2], [3]]]))
    assert n.identity and n.layout == SlurmLayout(1, 4, 1)
    assert n.to_linux({1, 2}) == {1, 2}


def test_intel_hyperthreads_i_and_i_plus_n_become_neighbours_in_slurms_ids(tmp_path):
    # 2 sockets x 2 cores x 2 threads, numbered as Intel servers do: socket 0 holds cores
    # {0,4} {1,5}, socket 1 {2,6} {3,7}.
    n = numbering_of_files(tmp_path, machine_files([[[0, 4], [1, 5]], [[2, 6], [3, 7]]]))
    assert n.layout == SlurmLayout(2, 2, 2)
    assert n.linux_of == (0, 4, 1, 5, 2, 6, 3, 7)
    assert n.to_linux({0, 1}) == {0, 4}          # Slurm's first core: both its threads
    assert n.cores == (frozenset({0, 4}), frozenset({1, 5}), frozenset({2, 6}),
                       frozenset({3, 7}))


def test_sockets_that_alternate_are_ordered_by_their_first_cpu(tmp_path):
    # Firmware that numbers socket 0's cores 0, 2, 4 and socket 1's 1, 3, 5.
    n = numbering_of_files(tmp_path, machine_files([[[1], [3], [5]], [[0], [2], [4]]]))
    assert n.linux_of == (0, 2, 4, 1, 3, 5)      # Slurm's socket 0 is the one with CPU 0
    assert not n.identity


def test_a_group_inside_a_package_orders_its_cores_before_the_next_group(tmp_path):
    # Two NUMA nodes in one package, interleaved: hwloc's tree puts node {0,2} before {1,3}.
    n = numbering_of_files(tmp_path, machine_files([[[0], [1], [2], [3]]],
                                                   numa=[[0, 2], [1, 3]]))
    assert n.linux_of == (0, 2, 1, 3)


@pytest.mark.parametrize("packages, numa, words", [
    ([[[0, 1], [2]]], None, "hybrid"),                    # cores of 2 and 1 threads
    ([[[0], [1]], [[2]]], None, "cores per socket"),       # packages of 2 and 1 cores
    ([[[0], [1], [2], [3]]], [[0, 1, 2], [2, 3]], "overlap"),  # groups that do not nest
])
def test_a_node_slurm_would_number_in_ways_not_told_is_refused(tmp_path, packages, numa, words):
    with pytest.raises(TopologyUnknown, match=words):
        numbering_of_files(tmp_path, machine_files(packages, numa=numa))


def test_offline_cpus_are_refused(tmp_path):
    files = machine_files([[[0], [1], [2], [3]]])
    files["devices/system/cpu/online"] = "0,2-3\n"
    with pytest.raises(TopologyUnknown, match="offline"):
        numbering_of_files(tmp_path, files)


def test_missing_or_garbled_topology_files_are_refused(tmp_path):
    files = machine_files([[[0], [1]]])
    del files["devices/system/cpu/cpu1/topology/thread_siblings_list"]
    with pytest.raises(TopologyUnknown, match="does not say CPU 1's core"):
        numbering_of_files(tmp_path / "a", files)
    files = machine_files([[[0], [1]]])
    files["devices/system/cpu/cpu1/topology/thread_siblings_list"] = "1-x\n"
    with pytest.raises(TopologyUnknown):
        numbering_of_files(tmp_path / "b", files)


def test_slurms_description_must_be_the_nodes(tmp_path):
    n = numbering_of_files(tmp_path, machine_files([[[0, 2], [1, 3]]]))
    check_against_slurm(n, SlurmLayout(1, 2, 2))
    with pytest.raises(TopologyUnknown, match="slurmd -C"):
        check_against_slurm(n, SlurmLayout(1, 4, 1))     # hyperthreads configured as cores
    with pytest.raises(TopologyUnknown, match="not on this node"):
        n.to_linux({4})


# -- real machines ---------------------------------------------------------------------------

def real_machines() -> list[Path]:
    return sorted(FIXTURES.glob("*.json"))


@pytest.mark.parametrize("path", real_machines(), ids=lambda p: p.stem)
def test_real_machines_are_numbered_as_hwloc_orders_them(tmp_path, path):
    """hwloc's logical PU order (lstopo's L#, or the XML's order) is what slurmd's map follows
    (abstract id = core index * threads + thread): our reading of the same machine's sysfs must
    give it CPU for CPU. A machine with offline CPUs must be refused instead."""
    machine = json.loads(path.read_text())
    cpu_dir, node_dir = write_sysfs(tmp_path, machine["sysfs"])
    threads = read_threads(cpu_dir, node_dir)
    online = sorted(t.cpu for t in threads)
    if online != list(range(len(online))):
        with pytest.raises(TopologyUnknown, match="offline"):
            node_numbering(cpu_dir=cpu_dir, node_dir=node_dir)
        return
    n = node_numbering(cpu_dir=cpu_dir, node_dir=node_dir)
    hwloc_order = tuple(os_index for _, os_index in sorted(machine["hwloc_pus"]))
    assert n.linux_of == hwloc_order
    assert n.cores == tuple(frozenset(c) for c in machine["hwloc_cores"])
    assert n.layout.sockets == len(machine["packages"])
    assert n.layout.cpus == len(hwloc_order)


def real_numbering(tmp_path: Path, name: str) -> CpuNumbering:
    machine = json.loads((FIXTURES / f"{name}.json").read_text())
    cpu_dir, node_dir = write_sysfs(tmp_path, machine["sysfs"])
    return node_numbering(cpu_dir=cpu_dir, node_dir=node_dir)


def test_the_real_machines_include_the_numberings_that_matter(tmp_path):
    """A two-socket Intel server with hyperthreads i and i + N, an AMD EPYC with SMT, one whose
    sockets alternate: where Slurm's order is not Linux's."""
    xeon = real_numbering(tmp_path / "a", "32intel64-2p8co2t+8ve")
    assert xeon.layout == SlurmLayout(2, 8, 2) and xeon.linux_of[:4] == (0, 16, 1, 17)
    epyc = real_numbering(tmp_path / "b", "AMD-17h-Zen-2xEpyc-7451")
    assert epyc.layout == SlurmLayout(2, 24, 2) and epyc.linux_of[:4] == (0, 48, 1, 49)
    proliant = real_numbering(tmp_path / "c", "24em64t-2n6c2t-pci")
    assert proliant.linux_of[:4] == (0, 12, 2, 14)    # socket 0: the even CPUs
