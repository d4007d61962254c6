"""The node's CPUs as Linux numbers them, and Slurm's abstract ids of them.

Slurm names a job's CPUs by *abstract* ids (``scontrol show job -d``'s CPU_IDs, squeue's
job_resources): a core's threads next to each other, cores socket after socket. slurmd maps
them to the ids Linux uses (the ones cpuset.cpus holds) through hwloc, in
``xcpuinfo_hwloc_topo_get`` (src/slurmd/common/xcpuinfo.c): abstract id
``core_index * threads_per_core + thread`` is the ``thread``-th hardware thread of the
``core_index``-th core in hwloc's logical order, and hwloc orders every object's children by the
first CPU of each (``hwloc__reorder_children``), with L1 and L2 caches left out by slurmd. On
one socket without hyperthreads the two numberings agree; on most servers they do not: Intel
numbers a core's two threads i and i + N, and some firmware alternates sockets.

This module is the one place that spells that rule. It reads the node's topology from sysfs
(what hwloc reads too), builds the map, and refuses (``TopologyUnknown``) where it cannot say
how Slurm numbers the node: offline CPUs (slurmd's map is then part linear), cores with
different thread counts (hybrid CPUs, whose E-cores slurmd drops), groups that do not nest, or
a layout that differs from the one Slurm reports for the node.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from malleable_protocol import format_cpu_list, parse_cpu_list
from malleable_protocol.errors import FixableError

SYSFS_CPU = Path("/sys/devices/system/cpu")
SYSFS_NODE = Path("/sys/devices/system/node")
_CPU_DIR = re.compile(r"cpu([0-9]{1,5})")
_NODE_DIR = re.compile(r"node([0-9]{1,5})")
MAX_CPUS = 65536


class TopologyUnknown(FixableError, RuntimeError):
    """The node's CPU numbering cannot be established: nothing may be written by CPU id."""


@dataclass(frozen=True)
class HardwareThread:
    """One CPU as the kernel lists it, with the groups (package, die, NUMA node, L3 cache, core)
    it belongs to, each as the set of Linux ids in it."""
    cpu: int
    package: frozenset[int]
    core: frozenset[int]
    groups: tuple[frozenset[int], ...] = ()   # die, cluster, NUMA node, L3: whichever exist


@dataclass(frozen=True)
class SlurmLayout:
    """How Slurm describes a node (sinfo/scontrol: Sockets, CoresPerSocket, ThreadsPerCore)."""
    sockets: int
    cores_per_socket: int
    threads_per_core: int

    @property
    def cpus(self) -> int:
        return self.sockets * self.cores_per_socket * self.threads_per_core

    def abstract_ids(self, cores: Iterable[tuple[int, int]]) -> frozenset[int]:
        """Slurm's abstract CPU ids of (socket, core) pairs (squeue's job_resources): core
        ``socket * cores_per_socket + core``, its threads next to each other."""
        ids: set[int] = set()
        for sock, core in cores:
            if not (0 <= sock < self.sockets and 0 <= core < self.cores_per_socket):
                raise ValueError(f"core ({sock},{core}) outside {self}")
            base = (sock * self.cores_per_socket + core) * self.threads_per_core
            ids.update(range(base, base + self.threads_per_core))
        return frozenset(ids)

    def __str__(self) -> str:
        return (f"{self.sockets} sockets x {self.cores_per_socket} cores x "
                f"{self.threads_per_core} threads")


@dataclass(frozen=True)
class CpuNumbering:
    """Slurm's abstract CPU ids of one node and the Linux ids they stand for."""
    linux_of: tuple[int, ...]                 # abstract id -> Linux id
    cores: tuple[frozenset[int], ...]         # each core's Linux ids, in Slurm's core order
    layout: SlurmLayout

    @property
    def identity(self) -> bool:
        return self.linux_of == tuple(range(len(self.linux_of)))

    def to_linux(self, abstract: Iterable[int]) -> frozenset[int]:
        """Linux ids of Slurm's abstract ``abstract``; an id the node does not have refuses."""
        out = set()
        for a in abstract:
            if not 0 <= a < len(self.linux_of):
                raise TopologyUnknown(f"Slurm's CPU {a} is not on this node "
                                      f"({len(self.linux_of)} CPUs: {self.layout})")
            out.add(self.linux_of[a])
        return frozenset(out)

    def describe(self) -> str:
        pairs = ", ".join(f"{a}->{c}" for a, c in enumerate(self.linux_of[:8]))
        more = ", ..." if len(self.linux_of) > 8 else ""
        kind = "the same as Linux's" if self.identity else f"abstract->Linux {pairs}{more}"
        return f"{self.layout}; Slurm's CPU ids {kind}"


def _is_laminar(sets: list[frozenset[int]]) -> tuple[frozenset[int], frozenset[int]] | None:
    """Two groups that overlap without one holding the other, or None: hwloc's tree needs
    every group inside or apart from every other."""
    by_size = sorted(set(sets), key=len, reverse=True)
    for i, big in enumerate(by_size):
        for small in by_size[i + 1:]:
            if small & big and not small <= big:
                return big, small
    return None


def numbering_of(threads: Iterable[HardwareThread]) -> CpuNumbering:
    """Slurm's abstract ids of these CPUs, as slurmd's xcpuinfo computes them over hwloc's tree:
    cores in depth-first order, each level's children ordered by their first CPU; a core's
    threads in Linux order."""
    threads = sorted(threads, key=lambda t: t.cpu)
    if not threads:
        raise TopologyUnknown("the node lists no CPUs")
    cpus = [t.cpu for t in threads]
    if cpus != list(range(len(cpus))):
        raise TopologyUnknown(
            f"the node's online CPUs are {format_cpu_list(cpus)}, not 0-{len(cpus) - 1}: with "
            "offline CPUs slurmd's map of Slurm's ids to Linux's is partly linear; bring them "
            "online or leave the node out of malleable partitions")
    for t in threads:
        if t.cpu not in t.core or not t.core <= t.package:
            raise TopologyUnknown(f"CPU {t.cpu}'s core {format_cpu_list(t.core)} is not "
                                  "inside its own package: the topology files disagree")
    cores = sorted({t.core for t in threads}, key=min)
    sizes = {len(c) for c in cores}
    if len(sizes) != 1:
        raise TopologyUnknown(
            f"cores with {sorted(sizes)} threads on one node (a hybrid CPU?): slurmd drops "
            "some of them, and this agent cannot say which")
    groups = [t.package for t in threads] + [g for t in threads for g in t.groups] + cores
    overlap = _is_laminar(groups)
    if overlap:
        raise TopologyUnknown(f"CPU groups {format_cpu_list(overlap[0])} and "
                              f"{format_cpu_list(overlap[1])} overlap without nesting: "
                              "hwloc's tree of this node cannot be told")
    # Each core's chain of groups, outermost first: those of its first thread (the groups nest,
    # so every thread of the core is in the same ones).
    first = {t.cpu: t for t in threads}
    chain = {core: sorted({first[min(core)].package, *first[min(core)].groups, core},
                          key=lambda g: (-len(g), min(g))) for core in cores}
    ordered = sorted(cores, key=lambda c: tuple(min(g) for g in chain[c]))
    packages = sorted({t.package for t in threads}, key=min)
    per_package = {len([c for c in cores if c <= p]) for p in packages}
    if len(per_package) != 1:
        raise TopologyUnknown(f"packages with {sorted(per_package)} cores: Slurm describes "
                              "a node by one count of cores per socket")
    layout = SlurmLayout(sockets=len(packages), cores_per_socket=per_package.pop(),
                         threads_per_core=sizes.pop())
    linux_of = tuple(c for core in ordered for c in sorted(core))
    return CpuNumbering(linux_of=linux_of, cores=tuple(ordered), layout=layout)


def check_against_slurm(numbering: CpuNumbering, slurm: SlurmLayout) -> None:
    """Refuse when Slurm's description of the node is not the node's: its abstract ids would
    then name other CPUs than slurmd's map gives them."""
    if slurm != numbering.layout:
        raise TopologyUnknown(
            f"Slurm describes this node as {slurm}, its CPUs are {numbering.layout}: "
            "make slurm.conf's Sockets/CoresPerSocket/ThreadsPerCore what `slurmd -C` prints")


# -- reading the node ------------------------------------------------------------------------

def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _mask_set(text: str, what: str) -> frozenset[int]:
    """A kernel CPU mask ("0000ff00,00000001": 32-bit hex words, the highest first)."""
    words = text.strip().split(",")
    if len(words) > MAX_CPUS // 32 or not all(w and len(w) <= 8 and
                                              all(c in "0123456789abcdefABCDEF" for c in w)
                                              for w in words):
        raise TopologyUnknown(f"{what}: not a CPU mask")
    value = int("".join(w.zfill(8) for w in words), 16)
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


def _listed(folder: Path, list_name: str, mask_name: str) -> frozenset[int] | None:
    """A CPU set sysfs gives as a list (``*_list``, ``cpulist``) or, on kernels before 2.6.27
    or so, only as a mask; None if neither is there."""
    text = _read(folder / list_name)
    if text is not None:
        return _cpu_set(text, str(folder / list_name))
    text = _read(folder / mask_name)
    return _mask_set(text, str(folder / mask_name)) if text is not None else None


def _cpu_set(text: str | None, what: str) -> frozenset[int]:
    if text is None:
        raise TopologyUnknown(f"{what} is missing: this kernel does not say its CPU topology")
    try:
        cpus = parse_cpu_list(text.strip())
    except ValueError as exc:
        raise TopologyUnknown(f"{what}: {exc}") from None
    if max(cpus, default=0) >= MAX_CPUS:
        raise TopologyUnknown(f"{what} names CPU {max(cpus)}")
    return cpus


def read_threads(cpu_dir: Path = SYSFS_CPU, node_dir: Path = SYSFS_NODE) -> list[HardwareThread]:
    """Every online CPU of this machine and its groups, from sysfs (as hwloc reads it)."""
    online = _online(cpu_dir)
    numa = []
    for entry in sorted(node_dir.iterdir()) if node_dir.is_dir() else ():
        if _NODE_DIR.fullmatch(entry.name):
            cpus = (_listed(entry, "cpulist", "cpumap") or frozenset()) & online
            if cpus:
                numa.append(cpus)
    sibling_lists: dict[int, dict[str, frozenset[int]]] = {}
    for cpu in sorted(online):
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        core = _listed(topo, "core_cpus_list", "core_cpus") or \
            _listed(topo, "thread_siblings_list", "thread_siblings")
        package = _listed(topo, "package_cpus_list", "package_cpus") or \
            _listed(topo, "core_siblings_list", "core_siblings")
        if core is None or package is None:
            raise TopologyUnknown(f"{topo} does not say CPU {cpu}'s core and package: this "
                                  "kernel does not say its CPU topology")
        lists = {"core": core & online, "package": package & online}
        for name in ("die_cpus_list", "cluster_cpus_list"):
            text = _read(topo / name)
            if text is not None and text.strip():
                lists[name] = _cpu_set(text, str(topo / name)) & online
        l3 = _l3_of(cpu_dir / f"cpu{cpu}" / "cache")
        if l3 is not None:
            lists["l3"] = l3 & online
        sibling_lists[cpu] = lists
    core_ids = {cpu: (_read(cpu_dir / f"cpu{cpu}" / "topology" / "core_id") or "").strip()
                for cpu in sibling_lists}
    threads = []
    for cpu, lists in sibling_lists.items():
        if len({core_ids[c] for c in lists["core"]}) > 1:
            # AMD's compute units (Bulldozer): Linux lists a unit's two cores as siblings but
            # gives each its own core_id; hwloc, and so slurmd, counts them as two cores.
            lists["core"] = frozenset({cpu})
        groups = [g for name, g in lists.items() if name not in ("core", "package")]
        groups += [n for n in numa if cpu in n]
        threads.append(HardwareThread(cpu=cpu, package=lists["package"], core=lists["core"],
                                      groups=tuple(groups)))
    return threads


def _online(cpu_dir: Path) -> frozenset[int]:
    """The online CPUs: the kernel's list, or (kernels without it) every cpuN folder with a
    topology whose ``online`` file, if any, says 1."""
    text = _read(cpu_dir / "online")
    if text is not None:
        return _cpu_set(text, str(cpu_dir / "online"))
    found = set()
    for entry in cpu_dir.iterdir() if cpu_dir.is_dir() else ():
        m = _CPU_DIR.fullmatch(entry.name)
        if m and (entry / "topology").is_dir() and \
                (_read(entry / "online") or "1").strip() == "1":
            found.add(int(m[1]))
    if not found:
        raise TopologyUnknown(f"{cpu_dir} lists no CPU: this kernel does not say its topology")
    return frozenset(found)


def _l3_of(cache_dir: Path) -> frozenset[int] | None:
    if not cache_dir.is_dir():
        return None
    for index in sorted(cache_dir.glob("index[0-9]*")):
        if (_read(index / "level") or "").strip() == "3":
            return _listed(index, "shared_cpu_list", "shared_cpu_map")
    return None


def node_numbering(*, cpu_dir: Path = SYSFS_CPU, node_dir: Path = SYSFS_NODE) -> CpuNumbering:
    """This node's numbering (``TopologyUnknown`` where it cannot be established)."""
    return numbering_of(read_threads(cpu_dir, node_dir))
