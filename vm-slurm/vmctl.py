#!/usr/bin/env python3
"""vm-slurm's cluster of QEMU virtual machines (standard library only).

    vmctl.py up N [--no-wait] [--timeout S]   boot vm1..vmN (vm1: slurmctld + slurmd), then wait
    vmctl.py wait [--timeout S]               until sinfo shows every node idle
    vmctl.py exec NODE CMD...                 run CMD as root in NODE (vm1 or 1), with this stdin;
                                              its exit code
    vmctl.py ssh NODE                         an interactive shell in NODE
    vmctl.py status                           the VMs, their ports and whether they run
    vmctl.py smoke                            end-to-end checks of the running cluster
    vmctl.py down                             stop every VM and the hub this started; drop overlays
Environment: STATE (/var/tmp/vm-slurm), VM_SLURM_PORT_BASE (42200), VM_SLURM_NET (10.77.0),
VM_SLURM_MEM (1024 MB), VM_SLURM_SMP (2), VM_SLURM_TASK_PLUGIN (the image's task/cgroup),
VM_SLURM_HWLOC_X86 (set 0: slurmd runs with HWLOC_COMPONENTS=-x86), VM_SLURM_SHARE (a host
folder every VM mounts at /shared over virtio-9p; default STATE/run/share, "none": no share),
VM_SLURM_TOPOLOGY (VMs numbered as servers are, "vm2=2x2x2,...": SOCKETSxCORESxTHREADS; see
`Topology`), VM_SLURM_CONFIGLESS (VMs whose slurmd runs configless, "vm2,...": no slurm.conf of
their own, slurmd fetches vm1's with --conf-server; vm1, the controller, never),
VM_SLURM_LOGIN (how many login hosts follow the N nodes, vm<N+1>...: no slurmd, no Slurm file of
their own; sackd fetches vm1's client configuration, as a configless site's login nodes do).

The image comes from build-image.sh (STATE/current). Emulation only (-accel tcg): KVM does not
run guests on the project's machines. Each VM has two NICs:
  * a QEMU user network with restrict=on (the guest reaches nothing outside it) whose only use
    is the host's ssh, forwarded from 127.0.0.1:SSH_BASE+i;
  * the private cluster network, 10.77.0.0/24 by default: QEMU UDP sockets on 127.0.0.1 joined
    by a small hub (this script, `hub`) that repeats every frame to the other VMs. Its
    addresses exist only inside the guests; the host sees loopback datagrams.
State: STATE/run/ (cluster.json, vmI.qcow2 overlays, vmI.pid, vmI.log serial consoles, hub.pid);
the serial logs of the last cluster are kept in STATE/last-logs/ after `down`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

STATE = Path(os.environ.get("STATE", "/var/tmp/vm-slurm"))
RUN = STATE / "run"
IMAGE = STATE / "current"
PORT_BASE = int(os.environ.get("VM_SLURM_PORT_BASE", "42200"))  # hub; ssh +i; udp +100+i
NET = os.environ.get("VM_SLURM_NET", "10.77.0")
MEM_MB = int(os.environ.get("VM_SLURM_MEM", "1024"))
SMP = int(os.environ.get("VM_SLURM_SMP", "2"))
# Slurm's TaskPlugin in the guests (the image's default is task/cgroup).
TASK_PLUGIN = os.environ.get("VM_SLURM_TASK_PLUGIN", "")
# "0": slurmd runs with HWLOC_COMPONENTS=-x86, so slurmstepd's tasks carry no inherited CPU pin.
HWLOC_X86 = os.environ.get("VM_SLURM_HWLOC_X86", "")
# A host folder shared by every VM (virtio-9p, mounted by the guest at /shared): "none" for none.
SHARE = os.environ.get("VM_SLURM_SHARE", "")
SHARE_TAG = "vmshare"
# VMs whose CPUs Linux numbers as a two-socket Intel server does, not in Slurm's abstract order.
TOPOLOGY = os.environ.get("VM_SLURM_TOPOLOGY", "")
# VMs whose slurmd takes its configuration from slurmctld (configless), as many sites run them.
CONFIGLESS = os.environ.get("VM_SLURM_CONFIGLESS", "")
# Login hosts after the nodes: users' sbatch, salloc and srun run there, no slurmd.
LOGIN = int(os.environ.get("VM_SLURM_LOGIN", "0") or 0)
HERE = Path(__file__).resolve().parent


def log(msg: str) -> None:
    print(f"[vm-slurm] {msg}", flush=True)


def load_cluster() -> dict | None:
    try:
        return json.loads((RUN / "cluster.json").read_text())
    except FileNotFoundError:
        return None


def node_index(node: str) -> int:
    return int(node[2:]) if node.startswith("vm") else int(node)


def nodes_of(cluster: dict) -> list[str]:
    """The VMs that are Slurm nodes (slurmd), in order: every VM but the login hosts."""
    return [f"vm{i}" for i in range(1, cluster["n"] + 1)
            if f"vm{i}" not in cluster.get("login", [])]


def port_free(port: int, kind: int) -> bool:
    with socket.socket(socket.AF_INET, kind) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pid_alive(pid: int, marker: str) -> bool:
    """True if pid runs and its command line holds marker (so a reused pid is not ours)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return marker in cmdline


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# --- the private network's hub ---------------------------------------------------------------
def hub(port: int, peers: list[int]) -> None:
    """Repeat each datagram (an Ethernet frame from a VM) to every other VM: a dumb hub."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", port))
    dests = [("127.0.0.1", p) for p in peers]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        data, src = sock.recvfrom(65536)
        for d in dests:
            if d != src:
                try:
                    sock.sendto(data, d)
                except OSError:
                    pass


# --- server topologies ------------------------------------------------------------------------
@dataclass(frozen=True)
class Topology:
    """A guest whose Linux CPU ids are not Slurm's abstract ones, as on real servers: the first
    thread of every core, sockets alternating (CPU 0 on socket 0, CPU 1 on socket 1, as some
    firmware does), then the second threads, so a core's threads are i and i + cores (Intel's
    numbering); one NUMA node per socket. Slurm's abstract order would put a core's threads
    next to each other and fill socket 0 first.

    QEMU numbers its CPUs socket by socket; Linux numbers them in the order of the ACPI MADT's
    entries. So the guest gets a second MADT listing the same local APICs in the server's order
    (``-acpitable``) and the kernel option ``acpi_apic_instance=2`` to read that one
    (docs/FACTS.md, "QEMU guests whose CPU numbering is not Slurm's")."""
    sockets: int
    cores: int
    threads: int

    @classmethod
    def parse(cls, text: str) -> "Topology":
        s, c, t = (int(x) for x in text.lower().split("x"))
        if not (1 <= s <= 4 and 1 <= c <= 8 and 1 <= t <= 2 and s * c * t <= 32):
            raise ValueError(f"topology {text!r}: SOCKETSxCORESxTHREADS, at most 32 CPUs")
        return cls(s, c, t)

    @property
    def cpus(self) -> int:
        return self.sockets * self.cores * self.threads

    def apic_id(self, socket: int, core: int, thread: int) -> int:
        """QEMU's APIC id of a CPU: socket, core and thread fields of just enough bits each."""
        tbits, cbits = (self.threads - 1).bit_length(), (self.cores - 1).bit_length()
        return socket << (cbits + tbits) | core << tbits | thread

    def linux_order(self) -> list[tuple[int, int, int]]:
        """(socket, core, thread) of Linux's CPU 0, 1, 2, ...: threads outermost, then cores,
        sockets innermost."""
        return [(s, c, t) for t in range(self.threads) for c in range(self.cores)
                for s in range(self.sockets)]

    def madt(self) -> bytes:
        """An ACPI MADT like QEMU 7.2's for the pc machine, local APICs in Linux's order (ACPI
        processor uid = APIC id, as QEMU's DSDT has it while APIC ids are dense)."""
        body = struct.pack("<II", 0xFEE00000, 1)                 # local APIC address, PCAT_COMPAT
        for s, c, t in self.linux_order():
            a = self.apic_id(s, c, t)
            body += struct.pack("<BBBBI", 0, 8, a, a, 1)         # processor local APIC, enabled
        body += struct.pack("<BBBBII", 1, 12, 0, 0, 0xFEC00000, 0)   # the I/O APIC
        body += struct.pack("<BBBBIH", 2, 10, 0, 0, 2, 0)        # IRQ 0 -> GSI 2
        for irq in (5, 9, 10, 11):                               # PCI IRQs: level, active high
            body += struct.pack("<BBBBIH", 2, 10, 0, irq, irq, 0x0D)
        body += struct.pack("<BBBHB", 4, 6, 0xFF, 0, 1)          # NMI on every CPU's LINT1
        table = bytearray(struct.pack("<4sIBB6s8sI4sI", b"APIC", 36 + len(body), 1, 0,
                                      b"BOCHS ", b"VMSLURM ", 1, b"BXPC", 1) + body)
        table[9] = -sum(table) & 0xFF
        return bytes(table)

    def qemu_args(self, madt_file: Path, mem_mb: int) -> list[str]:
        per_socket = self.cores * self.threads
        args = ["-cpu", "qemu64,vendor=GenuineIntel,+hypervisor",
                "-smp", f"{self.cpus},sockets={self.sockets},cores={self.cores},"
                        f"threads={self.threads}",
                "-acpitable", f"file={madt_file}"]
        for s in range(self.sockets):
            args += ["-object", f"memory-backend-ram,id=mem{s},size={mem_mb // self.sockets}M",
                     "-numa", f"node,nodeid={s},memdev=mem{s},"
                              f"cpus={s * per_socket}-{(s + 1) * per_socket - 1}"]
        return args

    def __str__(self) -> str:
        return f"{self.sockets}x{self.cores}x{self.threads}"


def topologies(text: str = TOPOLOGY) -> dict[int, Topology]:
    """VM_SLURM_TOPOLOGY ("vm2=2x2x2,vm3=2x4x2") as {VM index: topology}."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, spec = item.partition("=")
        out[node_index(name)] = Topology.parse(spec)
    return out


# --- ssh --------------------------------------------------------------------------------------
def ssh_argv(cluster: dict, i: int, tty: bool = False) -> list[str]:
    return [
        "ssh", "-i", str(Path(cluster["image"]) / "id_ed25519"), "-p", str(cluster["ssh"][i - 1]),
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
        *(["-t"] if tty else ["-T"]), "root@127.0.0.1",
    ]


def run_in(cluster: dict, i: int, command: str, timeout: float | None = None,
           capture: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([*ssh_argv(cluster, i), command], timeout=timeout, text=True,
                          stdin=subprocess.DEVNULL,
                          capture_output=capture)


# Kernel options: no_timer_check skips the guest's APIC timer sanity check, which fails at
# random under emulation (a known TCG early-boot panic).
KERNEL_OPTIONS = ("root=/dev/vda rw console=ttyS0 panic=-1 net.ifnames=0 fsck.mode=skip "
                  "no_timer_check systemd.unified_cgroup_hierarchy=1 systemd.show_status=1")
# How many times one VM is booted again after its kernel panicked before the node came up.
PANIC_REBOOTS = 2


def vm_argv(cluster: dict, i: int, share: Path | None) -> list[str]:
    """qemu's command line for VM i of cluster."""
    name, n, ssh_ports, udp_ports = f"vm{i}", cluster["n"], cluster["ssh"], cluster["udp"]
    image = Path(cluster["image"])
    topology = {int(k): Topology.parse(v) for k, v in cluster.get("topology", {}).items()}
    server = topology.get(i)
    layouts = ",".join(f"vm{k}={t}" for k, t in sorted(topology.items()))
    append = (f"{KERNEL_OPTIONS} vmslurm.name={name} vmslurm.n={n} vmslurm.net={cluster['net']}"
              + (" vmslurm.ctld=1" if i == 1 else "")
              + (" vmslurm.configless=1" if name in cluster.get("configless", []) else "")
              + (" vmslurm.login=1" if name in cluster.get("login", []) else "")
              + (f" vmslurm.logins={','.join(cluster['login'])}" if cluster.get("login") else "")
              + (f" vmslurm.layouts={layouts}" if layouts else "")
              + (" acpi_apic_instance=2" if server else "")
              + (f" vmslurm.taskplugin={TASK_PLUGIN}" if TASK_PLUGIN else "")
              + (f" vmslurm.hwloc_x86={HWLOC_X86}" if HWLOC_X86 else "")
              + (f" vmslurm.share={SHARE_TAG}" if share else ""))
    hx = f"{i:02x}"
    return [
        "qemu-system-x86_64", "-name", f"vmslurm-{name},process=vmslurm-{name}",
        "-accel", "tcg,thread=multi",
        *(server.qemu_args(RUN / f"{name}.madt", MEM_MB) if server else
          ["-smp", f"{SMP},sockets=1,cores={SMP},threads=1"]),
        "-m", str(MEM_MB), "-nodefaults", "-display", "none", "-vga", "none",
        "-serial", f"file:{RUN / (name + '.log')}", "-monitor", "none",
        "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"),
        "-append", append,
        "-drive", f"file={RUN / (name + '.qcow2')},if=virtio,format=qcow2,cache=unsafe,"
                  "discard=unmap",
        "-netdev", f"user,id=host,restrict=on,hostfwd=tcp:127.0.0.1:{ssh_ports[i - 1]}-:22",
        "-device", f"virtio-net-pci,netdev=host,mac=52:54:00:00:00:{hx}",
        "-netdev", f"socket,id=priv,udp=127.0.0.1:{cluster['hub']},"
                   f"localaddr=127.0.0.1:{udp_ports[i - 1]}",
        "-device", f"virtio-net-pci,netdev=priv,mac=52:54:00:77:00:{hx}",
        "-device", "virtio-rng-pci",
        # The shared folder: the guests' root writes it as the host's root (qemu's own
        # credentials, security_model=none); no other host path is exposed.
        *(["-virtfs", f"local,path={share},mount_tag={SHARE_TAG},security_model=none,"
                      f"id=share"] if share else []),
        "-no-reboot", "-daemonize", "-pidfile", str(RUN / f"{name}.pid"),
    ]


def boot_vm(cluster: dict, i: int) -> None:
    """Boot VM i on a new overlay of the image, with the command line recorded in RUN/vmI.cmd."""
    overlay = RUN / f"vm{i}.qcow2"
    overlay.unlink(missing_ok=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw",
                    "-b", str(Path(cluster["image"]) / "root.img"), str(overlay)], check=True)
    argv = shlex.split((RUN / f"vm{i}.cmd").read_text())
    subprocess.run(argv, check=True)


def panicked(console: Path) -> str | None:
    """The guest kernel's panic line in a serial console, if it has one."""
    try:
        text = console.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if "Kernel panic" in line:
            return line.strip()
    return None


# --- commands ---------------------------------------------------------------------------------
def slurm_build(image: Path) -> str:
    """The image's Slurm build, as build-image.sh's manifest says: "debian" (Debian's packages,
    multiple-slurmd: <node>_slurmstepd.scope), "production" (Debian's source without
    multiple-slurmd) or "smd" (SchedMD's packages, no multiple-slurmd): slurmstepd.scope."""
    manifest = (image / "manifest.txt").read_text(errors="replace")
    found = re.search(r"^slurm build: (production|smd),", manifest, re.M)
    return found.group(1) if found else "debian"


def stepd_scope(cluster: dict, node: str) -> str:
    """The node's slurmstepd scope under system.slice, by the cluster's Slurm build."""
    return ("slurmstepd.scope" if cluster.get("slurm_build", "debian") != "debian"
            else f"{node}_slurmstepd.scope")


def cmd_up(args) -> int:
    if load_cluster() is not None:
        log(f"a cluster is recorded in {RUN}: `vmctl.py down` first")
        return 1
    nodes = args.n
    n = nodes + LOGIN    # every VM: the nodes, then the login hosts
    if nodes < 1 or LOGIN < 0 or n > 50:
        log("N must be 1..50 VMs with the login hosts (VM_SLURM_LOGIN)")
        return 2
    rc = subprocess.run([str(HERE / "build-image.sh")]).returncode
    if rc:
        return rc
    image = IMAGE.resolve()
    try:
        servers = topologies()
    except ValueError as exc:
        log(f"VM_SLURM_TOPOLOGY: {exc}")
        return 2
    if any(not 1 <= k <= nodes for k in servers):
        log(f"VM_SLURM_TOPOLOGY names a VM outside the nodes vm1..vm{nodes}: {TOPOLOGY}")
        return 2
    configless = sorted({name.strip() for name in CONFIGLESS.split(",") if name.strip()})
    if any(name not in {f"vm{i}" for i in range(2, nodes + 1)} for name in configless):
        log(f"VM_SLURM_CONFIGLESS names a VM outside the nodes vm2..vm{nodes} (vm1 holds "
            f"slurm.conf): {CONFIGLESS}")
        return 2
    login = [f"vm{i}" for i in range(nodes + 1, n + 1)]
    ssh_ports = [PORT_BASE + i for i in range(1, n + 1)]
    udp_ports = [PORT_BASE + 100 + i for i in range(1, n + 1)]
    busy = [p for p in ssh_ports if not port_free(p, socket.SOCK_STREAM)]
    busy += [p for p in [PORT_BASE, *udp_ports] if not port_free(p, socket.SOCK_DGRAM)]
    if busy:
        log(f"ports in use on 127.0.0.1: {busy} (set VM_SLURM_PORT_BASE)")
        return 1
    if shutil.which("qemu-system-x86_64") is None:
        log("qemu-system-x86_64 is missing (build-image.sh installs it)")
        return 1
    RUN.mkdir(parents=True, exist_ok=True)
    share = None if SHARE == "none" else Path(SHARE or RUN / "share").absolute()
    if share is not None:
        share.mkdir(parents=True, exist_ok=True)
    started = time.time()
    cluster = {"n": n, "image": str(image), "ssh": ssh_ports, "udp": udp_ports,
               "hub": PORT_BASE, "net": NET, "started": started, "run": str(RUN),
               "share": str(share) if share else None,
               "topology": {str(k): str(t) for k, t in servers.items()},
               "configless": configless, "login": login, "slurm_build": slurm_build(image)}
    (RUN / "cluster.json").write_text(json.dumps(cluster, indent=1))

    hub_log = open(RUN / "hub.log", "w")
    hub_proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "hub", str(PORT_BASE),
         *map(str, udp_ports)], stdin=subprocess.DEVNULL, stdout=hub_log, stderr=hub_log,
        start_new_session=True)
    (RUN / "hub.pid").write_text(f"{hub_proc.pid}\n")

    for i, topology in servers.items():
        (RUN / f"vm{i}.madt").write_bytes(topology.madt())
    for i in range(1, n + 1):
        (RUN / f"vm{i}.cmd").write_text(shlex.join(vm_argv(cluster, i, share)) + "\n")
        boot_vm(cluster, i)
    log(f"{n} VMs started in {time.time() - started:.1f}s"
        + (f" ({', '.join(login)}: login host{'s' if len(login) > 1 else ''})" if login else "")
        + f" (ssh 127.0.0.1:{ssh_ports[0]}..{ssh_ports[-1]}; serial logs {RUN}/vmI.log)")
    if args.no_wait:
        return 0
    return cmd_wait(args)


def cmd_wait(args) -> int:
    cluster = load_cluster()
    if cluster is None:
        log("no cluster: `vmctl.py up N` first")
        return 1
    n = cluster["n"]
    deadline = time.time() + args.timeout
    want = set(nodes_of(cluster))
    last = ""
    reboots = {i: 0 for i in range(1, n + 1)}
    seen_up: set[str] = set()
    while time.time() < deadline:
        for i in range(1, n + 1):
            pid = read_pid(RUN / f"vm{i}.pid")
            if pid is None or not pid_alive(pid, f"vmslurm-vm{i},"):
                console = RUN / f"vm{i}.log"
                panic = panicked(console)
                if panic and reboots[i] < PANIC_REBOOTS and f"vm{i}" not in seen_up:
                    # Emulated guests panic at boot now and then (seen once in CI, in the
                    # scheduler clock, 4 s in): boot that VM again, keeping the console.
                    reboots[i] += 1
                    kept = console.with_name(f"vm{i}.panic{reboots[i]}.log")
                    console.rename(kept)
                    log(f"vm{i} panicked while booting ({panic}); console kept in {kept}; "
                        f"booting it again ({reboots[i]}/{PANIC_REBOOTS})")
                    boot_vm(cluster, i)
                    continue
                log(f"vm{i} is not running; last lines of its console:")
                print_tail(console)
                return 1
        try:
            r = run_in(cluster, 1, "sinfo -h -N -o '%N %T'", timeout=30, capture=True)
            out = r.stdout if r.returncode == 0 else ""
        except subprocess.TimeoutExpired:
            out = ""
        states = dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)
        seen_up.update(k for k, v in states.items() if v == "idle")
        if out and out != last:
            last = out
            log(f"{time.time() - cluster['started']:.0f}s: "
                + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
        logins = cluster.get("login", [])
        if set(states) == want and all(v == "idle" for v in states.values()) and \
                all(login_ready(cluster, h) for h in logins):
            log(f"healthy: {len(want)} nodes idle"
                + "".join(f", {h} answers sinfo" for h in logins)
                + f", {time.time() - cluster['started']:.1f}s after start")
            return 0
        time.sleep(2)
    log(f"not healthy after {args.timeout:.0f}s; last sinfo: {last.strip() or '(no answer)'}")
    for i in range(1, n + 1):
        print_tail(RUN / f"vm{i}.log", 15)
    return 1


def login_ready(cluster: dict, name: str) -> bool:
    """A login host is up when its client commands reach slurmctld (with sackd's configuration)."""
    try:
        return run_in(cluster, node_index(name), "sinfo -h -o %D", timeout=30,
                      capture=True).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def print_tail(path: Path, lines: int = 30) -> None:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return
    print(f"--- {path} (last {lines} lines)")
    print("\n".join(text[-lines:]))


def cmd_exec(args) -> int:
    cluster = load_cluster()
    if cluster is None:
        log("no cluster: `vmctl.py up N` first")
        return 1
    i = node_index(args.node)
    # One word is passed to the guest's shell as it is ("exec vm1 'a | b'"); several are quoted.
    command = shlex.join(args.argv) if len(args.argv) > 1 else args.argv[0]
    # stdin is the guest command's ("tar -c ... | vmctl.py exec vm1 'tar -x -C /opt'").
    return subprocess.run([*ssh_argv(cluster, i), command]).returncode


def cmd_ssh(args) -> int:
    cluster = load_cluster()
    if cluster is None:
        log("no cluster: `vmctl.py up N` first")
        return 1
    return subprocess.run(ssh_argv(cluster, node_index(args.node), tty=True)).returncode


SMOKE_JOB = r"""
j=$(runuser -u tester -- sbatch --parsable -w vm1 -D /tmp -o /dev/null --wrap 'sleep 120')
S=$(ls -d /sys/fs/cgroup/system.slice/*slurmstepd.scope)
# The job's folder: job_<J>, or its SLUID (Slurm 26.05 without CgroupJobIdPaths=yes), as Slurm
# says it; the script's task folder: task_0 (Slurm 22.05's v2: task_special, as it leaves a task
# when no per-task limit is asked for). (grep, not test -s: cgroup files report size 0 on newer
# kernels, such as 7.2.)
for _ in $(seq 60); do
  B=$S/job_$j; [ -d $B ] || B=$S/$(scontrol show job -d $j | grep -o 'SLUID=[^ ]*' | cut -d= -f2)
  T=$(grep -l . $B/step_batch/user/task_*/cgroup.procs 2>/dev/null | head -1)
  [ -n "$T" ] && break; sleep 0.5
done
T=$(dirname "$T")
echo "folder $(basename $B)"
echo "task $(basename $T)"
t=$(cat $T/cgroup.procs | tail -1)   # tail alone reads nothing of a size-0 file
al=$(cat $B/cpuset.cpus); all=$(cat $B/../cpuset.cpus.effective)
echo "cgroup $(cat /proc/$t/cgroup)"
echo "alloc $al"
echo $all > $B/cpuset.cpus && echo $all > $B/step_batch/user/cpuset.cpus
echo "grown $(cat $T/cpuset.cpus.effective) want $all"
echo $al > $B/step_batch/user/cpuset.cpus && echo $al > $B/cpuset.cpus
echo "shrunk $(cat $T/cpuset.cpus.effective) want $al"
scancel $j
"""


def cmd_smoke(args) -> int:
    """End-to-end checks of a running cluster; prints 'N passed, N failed'."""
    cluster = load_cluster()
    if cluster is None:
        log("no cluster: `vmctl.py up N` first")
        return 1
    n = cluster["n"]
    results: list[tuple[str, bool, str]] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        results.append((name, ok, detail))
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}",
              flush=True)

    for i in range(1, n + 1):
        r = run_in(cluster, i, "findmnt -n -o FSTYPE /sys/fs/cgroup; "
                   "cat /sys/fs/cgroup/cgroup.controllers", timeout=60, capture=True)
        out = r.stdout.split()
        check(f"vm{i} cgroup2 with cpuset", r.returncode == 0 and out[:1] == ["cgroup2"]
              and "cpuset" in out, r.stdout + r.stderr)
    for name in cluster.get("configless", []):
        r = run_in(cluster, node_index(name), "test ! -e /etc/slurm/slurm.conf && "
                   "grep -c '^SlurmctldHost=vm1' /run/slurm/conf/slurm.conf", timeout=60,
                   capture=True)
        check(f"{name} configless (no slurm.conf of its own; vm1's in /run/slurm/conf)",
              r.returncode == 0 and r.stdout.strip() == "1", r.stdout + r.stderr)
    nodes = nodes_of(cluster)
    r = run_in(cluster, 1, f"srun -N{len(nodes)} hostname", timeout=120, capture=True)
    names = sorted(r.stdout.split())
    check(f"srun -N{len(nodes)} hostname", r.returncode == 0 and names == nodes,
          r.stdout + r.stderr)
    for name in cluster.get("login", []):
        # A login host as configless sites run them: no slurmd, no Slurm file of its own, sackd
        # holding the controller's configuration; a user's srun there runs on the nodes.
        r = run_in(cluster, node_index(name), (
            "systemctl is-active slurmd || true; systemctl is-active sackd; "
            "test ! -e /etc/slurm/slurm.conf && grep -c '^SlurmctldHost=vm1' "
            "/run/slurm/conf/slurm.conf"), timeout=60, capture=True)
        check(f"{name} login host (no slurmd; sackd, vm1's configuration in /run/slurm/conf)",
              r.returncode == 0 and r.stdout.split() == ["inactive", "active", "1"],
              r.stdout + r.stderr)
        r = run_in(cluster, node_index(name), f"cd /tmp && runuser -u tester -- "
                   f"srun -N{len(nodes)} hostname", timeout=120, capture=True)
        check(f"srun -N{len(nodes)} hostname by tester on {name}",
              r.returncode == 0 and sorted(r.stdout.split()) == nodes, r.stdout + r.stderr)
    r = run_in(cluster, 1, SMOKE_JOB, timeout=120, capture=True)
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    cg = lines.get("cgroup", "")
    folder = lines.get("folder", "")
    task = lines.get("task", "")
    scope = stepd_scope(cluster, "vm1")
    check(f"job task in {scope}/{folder}/step_batch/user/{task} "
          f"(job_<J>, or the job's SLUID; task_0, or 22.05's task_special; Slurm's "
          f"{cluster.get('slurm_build', 'debian')} build)",
          re.fullmatch(r"job_[0-9]+|s[0-9A-Z]{13}", folder) is not None
          and task in ("task_0", "task_special")
          and cg == f"0::/system.slice/{scope}/{folder}/step_batch/user/{task}",
          r.stdout + r.stderr)
    for key in ("grown", "shrunk"):
        got, _, want = lines.get(key, "? want !").partition(" want ")
        check(f"job cpuset {key} (job folder, then step)" if key == "grown"
              else f"job cpuset {key} (step, then job folder)", got == want, r.stdout + r.stderr)
    failed = sum(not ok for _, ok, _ in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def cmd_status(args) -> int:
    cluster = load_cluster()
    if cluster is None:
        log("no cluster")
        return 1
    for i in range(1, cluster["n"] + 1):
        pid = read_pid(RUN / f"vm{i}.pid")
        alive = pid is not None and pid_alive(pid, f"vmslurm-vm{i},")
        print(f"vm{i} pid={pid} {'running' if alive else 'stopped'} "
              f"ssh=127.0.0.1:{cluster['ssh'][i - 1]} ip={cluster['net']}.{i}")
    return 0


def stop_pid(pid: int, marker: str, grace: float) -> str:
    if not pid_alive(pid, marker):
        return "not running"
    os.kill(pid, signal.SIGTERM)
    end = time.time() + grace
    while time.time() < end:
        if not pid_alive(pid, marker):
            return "stopped"
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        if not pid_alive(pid, marker):
            break
        time.sleep(0.1)
    return "killed"


def cmd_down(args) -> int:
    if not RUN.exists():
        log("no cluster")
        return 0
    rc = 0
    for pidfile in sorted(RUN.glob("vm*.pid")):
        name = pidfile.stem
        pid = read_pid(pidfile)
        if pid is None:
            continue
        # The guests need no clean shutdown: their overlays are thrown away.
        how = stop_pid(pid, f"vmslurm-{name},", args.grace)
        if pid_alive(pid, f"vmslurm-{name},"):
            rc = 1
        log(f"{name} (pid {pid}) {how}")
    hub_pid = read_pid(RUN / "hub.pid")
    if hub_pid is not None:
        stop_pid(hub_pid, " hub ", args.grace)
        if pid_alive(hub_pid, " hub "):
            rc = 1
    last = STATE / "last-logs"
    shutil.rmtree(last, ignore_errors=True)
    last.mkdir(parents=True)
    for f in RUN.glob("*.log"):
        shutil.copy(f, last / f.name)
    if rc == 0:
        shutil.rmtree(RUN)
        log(f"down (serial logs kept in {last})")
    else:
        log(f"some process would not stop; {RUN} kept")
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vmctl.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("up")
    s.add_argument("n", type=int)
    s.add_argument("--no-wait", action="store_true")
    s.add_argument("--timeout", type=float, default=600)
    s.set_defaults(func=cmd_up)
    s = sub.add_parser("wait")
    s.add_argument("--timeout", type=float, default=600)
    s.set_defaults(func=cmd_wait)
    s = sub.add_parser("exec")
    s.add_argument("node")
    s.add_argument("argv", nargs=argparse.REMAINDER)
    s.set_defaults(func=cmd_exec)
    s = sub.add_parser("ssh")
    s.add_argument("node")
    s.set_defaults(func=cmd_ssh)
    s = sub.add_parser("smoke")
    s.set_defaults(func=cmd_smoke)
    s = sub.add_parser("status")
    s.set_defaults(func=cmd_status)
    s = sub.add_parser("down")
    s.add_argument("--grace", type=float, default=10)
    s.set_defaults(func=cmd_down)
    s = sub.add_parser("hub")
    s.add_argument("port", type=int)
    s.add_argument("peers", type=int, nargs="+")
    s.set_defaults(func=lambda a: hub(a.port, a.peers))
    args = p.parse_args(argv)
    if args.command == "exec" and not args.argv:
        p.error("exec NODE CMD...")
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
