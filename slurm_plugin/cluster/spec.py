"""What a Slurm mini-cluster is: its spec, its folder layout and its rendered config.

Pure code: nothing here starts a process or touches the system, so it is shared by the local
cluster (``local.py``) and the dockerized one (``docker-slurm/``) and tested on its own.
"""
from __future__ import annotations

import json
import re
import string
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from malleable_protocol.errors import FixableError

NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,30}$")
# SchedulerParameters: "bf_interval=1,bf_resolution=1,bf_continue" (one line of slurm.conf).
_SCHED_ITEM = r"[a-z][a-z0-9_]*(=[A-Za-z0-9_.:-]+)?"
SCHED_PARAMS_RE = re.compile(rf"^{_SCHED_ITEM}(,{_SCHED_ITEM})*$")


class SpecError(FixableError, ValueError):
    pass


@dataclass(frozen=True)
class HostTopology:
    """A node's CPU layout as ``slurmd -C`` reports it."""

    cpus: int
    boards: int = 1
    sockets_per_board: int = 1
    cores_per_socket: int = 1
    threads_per_core: int = 1

    def as_slurm(self) -> str:
        return (f"CPUs={self.cpus} Boards={self.boards} SocketsPerBoard={self.sockets_per_board} "
                f"CoresPerSocket={self.cores_per_socket} ThreadsPerCore={self.threads_per_core}")


def parse_slurmd_c(text: str) -> HostTopology:
    """Parse the first line of ``slurmd -C`` ("NodeName=vm CPUs=2 Boards=1 ...")."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    fields = dict(kv.split("=", 1) for kv in first.split() if "=" in kv)
    try:
        return HostTopology(
            cpus=int(fields["CPUs"]),
            boards=int(fields.get("Boards", 1)),
            sockets_per_board=int(fields.get("SocketsPerBoard", 1)),
            cores_per_socket=int(fields.get("CoresPerSocket", fields["CPUs"])),
            threads_per_core=int(fields.get("ThreadsPerCore", 1)),
        )
    except (KeyError, ValueError) as exc:
        raise SpecError(f"cannot read the CPU layout from slurmd -C output: {first!r}") from exc


@dataclass(frozen=True)
class ClusterPaths:
    """Every file of one cluster lives below ``root``."""

    root: Path

    @property
    def etc(self) -> Path: return self.root / "etc"
    @property
    def slurm_conf(self) -> Path: return self.etc / "slurm.conf"
    @property
    def cgroup_conf(self) -> Path: return self.etc / "cgroup.conf"
    @property
    def state(self) -> Path: return self.root / "state"
    @property
    def spool(self) -> Path: return self.root / "spool"
    @property
    def tmp(self) -> Path: return self.root / "tmp"
    @property
    def log(self) -> Path: return self.root / "log"
    @property
    def run(self) -> Path: return self.root / "run"
    @property
    def munge(self) -> Path: return self.root / "munge"
    @property
    def munge_socket(self) -> Path: return self.munge / "munge.socket"
    @property
    def munge_key(self) -> Path: return self.munge / "munge.key"
    @property
    def slurmdbd_conf(self) -> Path: return self.etc / "slurmdbd.conf"
    @property
    def db(self) -> Path: return self.root / "db"          # MariaDB's data (accounting only)
    @property
    def db_socket(self) -> Path: return self.root / "run" / "mariadb.sock"
    @property
    def spec_file(self) -> Path: return self.root / "cluster.json"
    @property
    def daemons_file(self) -> Path: return self.run / "daemons.json"


_PATH_FIELDS = ("root", "prolog", "epilog", "job_submit_lua", "ctld_event", "plugstack",
                "munge_socket", "slurm_sbin")


@dataclass(frozen=True)
class ClusterSpec:
    root: Path
    name: str = "malleable"
    nodes: int = 3
    node_prefix: str = "n"
    partition: str = "debug"
    port_base: int = 17817
    hostname: str = "localhost"
    address: str = "127.0.0.1"
    topology: HostTopology = field(default_factory=lambda: HostTopology(cpus=1))
    # Declared CPUs per node when they differ from the real topology (Slurm then needs
    # SlurmdParameters=config_overrides). None means the real layout.
    cpus_per_node: int | None = None
    slurm_user: str = "root"
    cgroup_plugin: str = "cgroup/v1"
    cgroup_mountpoint: str = "/sys/fs/cgroup"
    # Hook slots, filled by the co-scheduler's installer.
    prolog: Path | None = None
    epilog: Path | None = None
    job_submit_lua: Path | None = None
    ctld_event: Path | None = None     # PrologSlurmctld and EpilogSlurmctld: wakes the watcher
    plugstack: Path | None = None      # PlugStackConfig: the SPANK plugin (steps in grown jobs)
    # Nodes only declared (State=DOWN, no slurmd): a cluster of that size to slurmctld, for
    # measuring what costs grow with the node count.
    phantom_nodes: int = 0
    # False: every node is a slurmd on one host (``hostname``/``address``), told apart by port.
    # True: each node is a host of its own, named after the node (docker-slurm's containers).
    own_hosts: bool = False
    # munged's socket when it is not the cluster folder's (each docker-slurm container runs
    # its own munged at Debian's default socket, while the cluster folder is shared).
    munge_socket: Path | None = None
    # Where slurmctld and slurmd come from, when not from PATH: another build of Slurm (one
    # without multiple-slurmd, as sites run: one node, its folders named slurm/slurmstepd.scope).
    # Its slurmd starts its own slurmstepd; the client commands of PATH speak the same protocol.
    slurm_sbin: Path | None = None
    # True: slurmdbd on a MariaDB of the cluster's own (loopback), so sacct sees the jobs and
    # the watcher writes each malleable job's borrowed and lent cores into them.
    accounting: bool = False
    # Slurm's SchedulerParameters line as given ("bf_interval=1,bf_resolution=1"), None: Slurm's
    # defaults. The backfill parameters a replay of a trace compares the simulator with.
    scheduler_parameters: str | None = None
    # True: each node's agent keeps a folder of its own, filled by the feed link from the
    # watcher (TCP on feed_link_port, munge), as on a site without a shared file system.
    feed_link: bool = False
    # Hosts of backup slurmctlds (SlurmctldHost lines after the primary's), each with a watcher
    # of its own: docker-slurm's failover test. Each host's slurmctld needs a pid file of its
    # own, so only where nodes are hosts of their own.
    backup_controllers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not NAME_RE.match(self.name):
            raise SpecError(f"cluster name {self.name!r} must match {NAME_RE.pattern}")
        if not NAME_RE.match(self.node_prefix) or not NAME_RE.match(self.partition):
            raise SpecError("node prefix and partition must be plain names")
        if not 1 <= self.nodes <= 64:
            raise SpecError(f"nodes must be between 1 and 64, not {self.nodes}")
        if not 1024 <= self.port_base <= 65535 - 100 - self.nodes:
            raise SpecError(f"port base {self.port_base} out of range "
                            f"(1024..{65535 - 100 - self.nodes})")
        if self.cpus_per_node is not None and self.cpus_per_node < 1:
            raise SpecError("cpus_per_node must be positive")
        if self.scheduler_parameters is not None and not SCHED_PARAMS_RE.match(
                self.scheduler_parameters):
            raise SpecError(f"scheduler parameters {self.scheduler_parameters!r} must be "
                            "comma-separated name or name=value items")
        if not Path(self.root).is_absolute():
            raise SpecError(f"cluster folder must be an absolute path, not {self.root}")
        if self.backup_controllers and not self.own_hosts:
            raise SpecError("backup controllers need hosts of their own (own_hosts)")
        for host in self.backup_controllers:
            if not NAME_RE.match(host) or host == self.hostname:
                raise SpecError(f"backup controller {host!r} must be a plain host name, "
                                "not the primary's")

    @property
    def paths(self) -> ClusterPaths:
        return ClusterPaths(Path(self.root))

    @property
    def node_names(self) -> list[str]:
        return [f"{self.node_prefix}{i}" for i in range(1, self.nodes + 1)]

    @property
    def slurmctld_port(self) -> int:
        return self.port_base

    def node_port(self, name: str) -> int:
        return self.port_base + self.node_names.index(name) + 1

    @property
    def ports(self) -> dict[str, int]:
        """Every port the cluster listens on, keyed by the daemon that owns it."""
        out = {"slurmctld": self.slurmctld_port}
        out.update({f"slurmd {n}": self.node_port(n) for n in self.node_names})
        out.update({f"agent metrics {n}": self.metrics_port(n) for n in self.node_names})
        out["watcher metrics"] = self.watcher_metrics_port
        if self.accounting:
            out.update({"slurmdbd": self.slurmdbd_port, "mariadb": self.mariadb_port})
        if self.feed_link:
            out["feed link"] = self.feed_link_port
        return out

    @property
    def feed_link_port(self) -> int:
        return self.port_base + 96

    @property
    def watcher_metrics_port(self) -> int:
        return self.port_base + 99

    @property
    def slurmdbd_port(self) -> int:
        return self.port_base + 98

    @property
    def mariadb_port(self) -> int:
        return self.port_base + 97

    def metrics_port(self, name: str) -> int:
        """Each node's agent serves Prometheus metrics on loopback, above the Slurm ports."""
        return self.port_base + 100 + self.node_names.index(name)

    def to_json(self) -> str:
        d = asdict(self)
        for k in _PATH_FIELDS:
            d[k] = None if d[k] is None else str(d[k])
        return json.dumps(d, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ClusterSpec":
        d = json.loads(text)
        d["topology"] = HostTopology(**d["topology"])
        d["backup_controllers"] = tuple(d.get("backup_controllers", ()))
        for k in _PATH_FIELDS:
            d[k] = None if d.get(k) is None else Path(d[k])
        return cls(**d)

    def with_hooks(self, *, prolog: Path | None, epilog: Path | None,
                   job_submit_lua: Path | None, ctld_event: Path | None = None,
                   plugstack: Path | None = None) -> "ClusterSpec":
        return replace(self, prolog=prolog, epilog=epilog, job_submit_lua=job_submit_lua,
                       ctld_event=ctld_event, plugstack=plugstack)


def _template(name: str) -> string.Template:
    text = resources.files("slurm_plugin.hooks").joinpath("templates", name).read_text()
    return string.Template(text)


def render_slurm_conf(spec: ClusterSpec) -> str:
    p = spec.paths
    optional: list[str] = []
    layout = spec.topology.as_slurm()
    if spec.cpus_per_node is not None and spec.cpus_per_node != spec.topology.cpus:
        # A node may declare more CPUs than exist; Slurm core ids then wrap onto real CPUs.
        optional.append("SlurmdParameters=config_overrides")
        layout = (f"CPUs={spec.cpus_per_node} Boards=1 SocketsPerBoard=1 "
                  f"CoresPerSocket={spec.cpus_per_node} ThreadsPerCore=1")
    if spec.scheduler_parameters is not None:
        optional.append(f"SchedulerParameters={spec.scheduler_parameters}")
    if spec.job_submit_lua is not None:
        # Slurm reads job_submit.lua from the folder of slurm.conf; the cluster copies it there.
        optional.append("JobSubmitPlugins=lua")
    if spec.prolog is not None:
        optional.append(f"Prolog={spec.prolog}")
    if spec.epilog is not None:
        optional.append(f"Epilog={spec.epilog}")
    if spec.ctld_event is not None:
        optional.append(f"PrologSlurmctld={spec.ctld_event}")
        optional.append(f"EpilogSlurmctld={spec.ctld_event}")
    if spec.plugstack is not None:
        optional.append(f"PlugStackConfig={spec.plugstack}")
    storage = ["AccountingStorageType=accounting_storage/none"]
    if spec.accounting:
        storage = ["AccountingStorageType=accounting_storage/slurmdbd",
                   f"AccountingStorageHost={spec.hostname}",
                   f"AccountingStoragePort={spec.slurmdbd_port}",
                   # With munge, the socket of munged that talks to slurmdbd (AuthInfo's is not
                   # used for it: without this line sacct asks Debian's default socket).
                   f"AccountingStoragePass={spec.munge_socket or p.munge_socket}"]
    node_lines = [
        f"NodeName={n} NodeHostname={n if spec.own_hosts else spec.hostname} "
        f"NodeAddr={n if spec.own_hosts else spec.address} "
        f"Port={spec.node_port(n)} {layout} State=UNKNOWN"
        for n in spec.node_names
    ]
    if spec.phantom_nodes:
        first = spec.port_base + 1000
        node_lines.append(
            f"NodeName=ph[1-{spec.phantom_nodes}] NodeHostname={spec.hostname} "
            f"NodeAddr={spec.address} Port=[{first}-{first + spec.phantom_nodes - 1}] {layout} "
            "State=DOWN")
    return _template("slurm.conf.tmpl").substitute(
        cluster_name=spec.name,
        controller_host=spec.hostname,
        controller_addr=spec.address,
        backup_lines="".join(f"\nSlurmctldHost={h}" for h in spec.backup_controllers),
        # Where controllers are hosts of their own, each its own pid file (a shared one would
        # name a pid of another host's namespace, which slurmctld kills at start).
        slurmctld_pid_file=Path("/run/slurmctld.pid") if spec.own_hosts else
        p.run / "slurmctld.pid",
        slurmctld_port=spec.slurmctld_port,
        slurm_user=spec.slurm_user,
        munge_socket=spec.munge_socket or p.munge_socket,
        state_dir=p.state,
        spool_dir=p.spool,
        tmp_dir=p.tmp,
        run_dir=p.run,
        log_dir=p.log,
        accounting_lines="\n".join(storage),
        optional_lines="\n".join(optional),
        node_lines="\n".join(node_lines),
        partition=spec.partition,
    )


def render_slurmdbd_conf(spec: ClusterSpec, db_password: str) -> str:
    """slurmdbd.conf (slurmdbd reads it from slurm.conf's folder; it must be SlurmUser's, 0600:
    it holds the database password)."""
    p = spec.paths
    return "\n".join([
        "# slurmdbd.conf rendered by malleable (slurm_plugin.cluster.spec)",
        "AuthType=auth/munge", f"AuthInfo=socket={spec.munge_socket or p.munge_socket}",
        f"DbdHost={spec.hostname}", f"DbdAddr={spec.address}", f"DbdPort={spec.slurmdbd_port}",
        f"SlurmUser={spec.slurm_user}", f"PidFile={p.run / 'slurmdbd.pid'}",
        f"LogFile={p.log / 'slurmdbd.log'}", "DebugLevel=info",
        "StorageType=accounting_storage/mysql", f"StorageHost={spec.address}",
        f"StoragePort={spec.mariadb_port}", f"StorageUser={DB_USER}",
        f"StoragePass={db_password}", f"StorageLoc={DB_NAME}", ""])


DB_USER = "slurm"
DB_NAME = "slurm_acct_db"


def render_cgroup_conf(spec: ClusterSpec) -> str:
    return _template("cgroup.conf.tmpl").substitute(
        cgroup_plugin=spec.cgroup_plugin, cgroup_mountpoint=spec.cgroup_mountpoint)
