"""vm-slurm's server-numbered guests (vm-slurm/vmctl.py's Topology): the MADT that makes Linux
number a QEMU guest's CPUs as a two-socket Intel server does. The guest itself is checked live
(tests/vm/test_topology.py); here the table's bytes and the numbering they ask for."""
from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path

import pytest

VMCTL = Path(__file__).resolve().parents[3] / "vm-slurm" / "vmctl.py"


@pytest.fixture(scope="module")
def vmctl():
    spec = importlib.util.spec_from_file_location("vmctl", VMCTL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["vmctl"] = module
    spec.loader.exec_module(module)
    return module


def local_apics(table: bytes) -> list[tuple[int, int, int]]:
    """(ACPI uid, APIC id, flags) of each processor local APIC entry, in table order."""
    out, offset = [], 44
    while offset < len(table):
        kind, length = table[offset], table[offset + 1]
        assert length >= 2, f"entry of length {length} at {offset}"
        if kind == 0:
            uid, apic, flags = struct.unpack_from("<BBI", table, offset + 2)
            out.append((uid, apic, flags))
        offset += length
    assert offset == len(table)
    return out


def test_the_madt_lists_first_threads_with_sockets_alternating_then_second_threads(vmctl):
    t = vmctl.Topology.parse("2x2x2")
    table = t.madt()
    assert table[:4] == b"APIC" and struct.unpack_from("<I", table, 4)[0] == len(table)
    assert sum(table) % 256 == 0                       # the ACPI checksum
    apics = local_apics(table)
    # QEMU's APIC id: socket << 2 | core << 1 | thread. Linux CPU k is the k-th entry.
    assert [a for _, a, _ in apics] == [0, 4, 2, 6, 1, 5, 3, 7]
    assert all(uid == a and flags == 1 for uid, a, flags in apics)
    order = t.linux_order()
    core_of = {cpu: (s, c) for cpu, (s, c, _) in enumerate(order)}
    assert {cpu for cpu, sc in core_of.items() if sc == (0, 0)} == {0, 4}   # threads i, i + 4
    assert [s for s, _, _ in order[:4]] == [0, 1, 0, 1]                      # sockets alternate


def test_apic_ids_leave_room_for_counts_that_are_not_powers_of_two(vmctl):
    t = vmctl.Topology.parse("2x3x2")
    ids = sorted(t.apic_id(s, c, h) for s, c, h in t.linux_order())
    assert len(set(ids)) == t.cpus == 12
    assert t.apic_id(1, 0, 0) == 8                      # 2 bits of core, 1 of thread
    assert len(local_apics(t.madt())) == 12


def test_bad_topologies_are_refused_and_the_env_names_vms(vmctl):
    for bad in ("2x2", "0x2x2", "2x2x4", "4x8x2", "axbxc"):
        with pytest.raises(ValueError):
            vmctl.Topology.parse(bad)
    assert vmctl.topologies("vm2=2x2x2, vm3=1x4x2") == {
        2: vmctl.Topology(2, 2, 2), 3: vmctl.Topology(1, 4, 2)}
    assert vmctl.topologies("") == {}


def test_qemu_gets_the_table_numa_nodes_and_the_smp_shape(vmctl, tmp_path):
    args = vmctl.Topology(2, 2, 2).qemu_args(tmp_path / "vm2.madt", 1024)
    joined = " ".join(args)
    assert "-smp 8,sockets=2,cores=2,threads=2" in joined
    assert f"-acpitable file={tmp_path / 'vm2.madt'}" in joined
    assert "node,nodeid=0,memdev=mem0,cpus=0-3" in joined
    assert "node,nodeid=1,memdev=mem1,cpus=4-7" in joined
    assert "size=512M" in joined


def test_a_login_host_boots_without_slurmd_and_is_no_node(vmctl, tmp_path):
    """The login host (VM_SLURM_LOGIN) is told so on its kernel command line, every VM is told
    which VMs are login hosts (no NodeName line for them), and the cluster's nodes leave it out."""
    cluster = {"n": 3, "image": str(tmp_path), "ssh": [1, 2, 3], "udp": [4, 5, 6], "hub": 7,
               "net": "10.77.0", "topology": {}, "configless": ["vm2"], "login": ["vm3"]}
    lines = {i: " ".join(vmctl.vm_argv(cluster, i, None)) for i in (1, 2, 3)}
    assert [("vmslurm.login=1" in lines[i], "vmslurm.logins=vm3" in lines[i])
            for i in (1, 2, 3)] == [(False, True), (False, True), (True, True)]
    assert "vmslurm.configless=1" in lines[2] and "vmslurm.configless=1" not in lines[3]
    assert vmctl.nodes_of(cluster) == ["vm1", "vm2"]
    assert vmctl.nodes_of({**cluster, "login": []}) == ["vm1", "vm2", "vm3"]
