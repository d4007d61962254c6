"""A real Slurm mini-cluster on this machine: munged, slurmctld and several slurmd.

All of its state, logs and sockets live in one folder. ``up`` waits until the controller
answers and every node is idle; ``down`` stops exactly the processes ``up`` started (by pid and
start time) and removes the cgroup folders its nodes made.
"""
from __future__ import annotations

import errno
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable

from malleable_protocol.errors import FixableError
from malleable_protocol.runner import CommandError, CommandNotFound, CommandRunner, run_command

from slurm_plugin import cgroups
from slurm_plugin.node.jobfs import node_mounts, unmount_job_fs
from malleable_policy.model import Policy
from slurm_plugin.slurm import CliSlurmClient, Job, Node
from slurm_plugin.cluster import daemons
from slurm_plugin.cluster.spec import (DB_NAME, DB_USER, ClusterSpec, HostTopology, parse_slurmd_c,
                   render_cgroup_conf, render_slurm_conf, render_slurmdbd_conf)
from slurm_plugin.settings import cluster_dir

DEFAULT_ROOT = cluster_dir(os.environ)

# The commands the cluster needs, and the Debian package that ships each.
REQUIRED_BINARIES = {
    "munged": "munge", "munge": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd",
    "scontrol": "slurm-client", "sinfo": "slurm-client", "squeue": "slurm-client",
}
# And those of a cluster with accounting (``ClusterSpec.accounting``).
ACCOUNTING_BINARIES = {
    "slurmdbd": "slurmdbd", "sacct": "slurm-client", "sacctmgr": "slurm-client",
    "mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server-core",
    "mariadb": "mariadb-client-core",
}


class ClusterError(FixableError, RuntimeError):
    pass


@dataclass
class ClusterStatus:
    root: Path
    running: dict[str, bool]
    controller_up: bool
    nodes: list[Node] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)


def host_topology(runner: CommandRunner = run_command) -> HostTopology:
    try:
        return parse_slurmd_c(runner(["slurmd", "-C"], timeout=20).stdout)
    except CommandNotFound as exc:
        raise ClusterError("slurmd is not installed: 'slurmd' not found on PATH "
                           "(run scripts/setup.sh, or apt-get install slurmd)") from exc


def default_spec(root: Path = DEFAULT_ROOT, *, runner: CommandRunner = run_command,
                 **overrides) -> ClusterSpec:
    """A spec for this machine: its hostname and real CPU layout; the nodes' agents on the
    feed link (each its own feed folder), as a site without a shared file system runs them,
    unless ``feed_link=False`` (one feed folder for the watcher and every agent)."""
    overrides.setdefault("feed_link", True)
    return ClusterSpec(root=Path(root).absolute(), hostname=socket.gethostname().split(".")[0],
                       topology=host_topology(runner), **overrides)


def port_holder(port: int) -> str:
    try:
        import psutil      # the cluster extra's: only to name who holds a port
    except ImportError:
        return "another process"
    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid:
                    try:
                        return f"pid {conn.pid} ({' '.join(psutil.Process(conn.pid).cmdline())[:80]})"
                    except psutil.Error:
                        return f"pid {conn.pid}"
    except psutil.Error:
        pass
    return "another process"


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_ports(text: str | None = None) -> range:
    """Linux's ephemeral ports (net.ipv4.ip_local_port_range): any outgoing connection may
    take one of them as its own, for a while, so a daemon's port among them is free or not by
    chance (seen: a benchmark's slurmd port held by a client). Linux's default when the file
    cannot be read."""
    try:
        if text is None:
            text = EPHEMERAL_RANGE_FILE.read_text()
        lo, hi = (int(x) for x in text.split()[:2])
        return range(lo, hi + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def check_port_free(address: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the daemons do: connections in TIME_WAIT from a previous cluster do not block.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise OSError(exc.errno, f"in use by {port_holder(port)}") from exc
            raise


def write_cluster_files(spec: ClusterSpec) -> None:
    """The cluster folder: daemons' folders, the munge key (made once), slurm.conf, cgroup.conf,
    job_submit.lua and cluster.json. Shared by the local cluster and docker-slurm."""
    p = spec.paths
    for d in (p.root, p.etc, p.state, p.spool, p.log, p.run, p.munge):
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)  # munged refuses a socket folder others cannot traverse
    p.tmp.mkdir(exist_ok=True)
    os.chmod(p.tmp, 0o755)
    for node in spec.node_names:
        (p.spool / node).mkdir(exist_ok=True)
        (p.tmp / node).mkdir(exist_ok=True)
        os.chmod(p.tmp / node, 0o1777)  # like /tmp: every job user writes there
    if not p.munge_key.exists():
        fd = os.open(p.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
    p.slurm_conf.write_text(render_slurm_conf(spec))
    p.cgroup_conf.write_text(render_cgroup_conf(spec))
    if spec.job_submit_lua is not None:
        shutil.copyfile(spec.job_submit_lua, p.etc / "job_submit.lua")
    tmp = p.spec_file.with_suffix(".tmp")
    tmp.write_text(spec.to_json())
    os.replace(tmp, p.spec_file)


def hooks_dir(spec: ClusterSpec) -> Path:
    return spec.paths.root / "hooks"


def install_cluster_hooks(spec: ClusterSpec, policy: Policy, *,
                          spank_library: Path | None = None) -> ClusterSpec:
    """What `malleable install-slurm-hooks` does on a real cluster, below the cluster folder
    (with ``spank_library``, the Debian package's plugin instead of one built here): returns
    the spec with its hook slots filled."""
    from slurm_plugin.node.config import NODE_PATTERN, AgentConfig
    from slurm_plugin.hooks.install import install, prepare_node_folders
    from slurm_plugin.feed.store import FeedStore
    config = AgentConfig.under(spec.paths.root, policy=policy, slurm_conf=spec.paths.slurm_conf)
    if spec.feed_link:
        # Each node's copy of its feed: its own host's folder where nodes are hosts (docker),
        # else one per node beside the cluster's folders.
        node_feed = Path("/run/malleable/feed") if spec.own_hosts else \
            spec.paths.root / "node-feed" / NODE_PATTERN
        config = replace(config, feed_dir=node_feed,
                         watcher_dir=config.feed_dir, feed_link_hosts=(spec.address, *spec.backup_controllers),
                         feed_link_port=spec.feed_link_port,
                         munge_socket=spec.munge_socket or spec.paths.munge_socket)
    paths = install(hooks_dir(spec), config, spank_library=spank_library)
    prepare_node_folders(config)
    FeedStore(config.watcher_feed_dir).prepare()
    return spec.with_hooks(prolog=paths["prolog.sh"], epilog=paths["epilog.sh"],
                           job_submit_lua=paths["job_submit.lua"],
                           ctld_event=paths["ctld_event.sh"], plugstack=paths["plugstack.conf"])


class LocalCluster:
    def __init__(self, spec: ClusterSpec, *, runner: CommandRunner = run_command,
                 which: Callable[[str], str | None] = shutil.which,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.spec = spec
        self.paths = spec.paths
        self._run = runner
        self._which = which
        self._clock = clock
        self._sleep = sleep

    @classmethod
    def load(cls, root: Path = DEFAULT_ROOT, **kwargs) -> "LocalCluster":
        spec_file = Path(root) / "cluster.json"
        if not spec_file.exists():
            raise ClusterError(f"no cluster at {root} (no {spec_file}): run 'malleable cluster up'")
        return cls(ClusterSpec.from_json(spec_file.read_text()), **kwargs)

    # --- what the outside sees -------------------------------------------------------------

    def client(self) -> CliSlurmClient:
        return CliSlurmClient(self._run, env=self.env())

    def env(self) -> dict[str, str]:
        """What points Slurm's commands (and malleable-srun) at this cluster. Jobs inherit it
        from sbatch. The nodes share one host, but each has its own scratch folder, so Open MPI's
        shared-memory transport between ranks of different nodes crashes (seen: a segfault in
        mca_btl_vader with 2 ranks on each of 2 nodes); they talk over TCP on loopback instead.
        And Horovod hangs in its MPI calls when each CPU of the host runs pinned ranks of two
        of these nodes (seen with plain Horovod 0.28.1 and no malleable_tf: 2 nodes x 2 ranks,
        rank i pinned to CPU i mod 2 by taskset, in hvd.init or the first response-cache sync;
        unpinned, 50 allreduces take about a second; the cache off helped once, not always):
        ranks pin themselves to their whole allowance here, not their share, and the cache is
        off."""
        return {"SLURM_CONF": str(self.paths.slurm_conf),
                "MALLEABLE_RUN_DIR": str(self.paths.root / "malleable"),
                "MALLEABLE_FEED_DIR": str(self.paths.root / "feed"),
                "OMPI_MCA_btl": "self,tcp",
                "HOROVOD_CACHE_CAPACITY": "0", "MALLEABLE_TF_PIN": "allowance"}

    @property
    def run_layout(self):
        """Where this cluster's ranks and agents meet (malleable_protocol.RunLayout)."""
        from malleable_protocol import RunLayout
        return RunLayout(self.paths.root / "malleable")

    def cgroup_layout(self, node: str) -> "cgroups.SlurmCgroupLayout":
        """Where this cluster's slurmd for ``node`` puts its jobs' cgroup folders (discovered)."""
        return cgroups.discover_layout(node, slurm_conf=self.paths.slurm_conf)

    def cgroup_hierarchy(self, node: str) -> Path:
        """The cpuset hierarchy's folder ``node``'s jobs live in; known before its first job."""
        return cgroups.discover_hierarchy(node, slurm_conf=self.paths.slurm_conf)

    def env_lines(self) -> list[str]:
        return [f"export {k}={v}" for k, v in self.env().items()]

    def records(self) -> list[daemons.DaemonRecord]:
        return daemons.load_records(self.paths.daemons_file)

    def is_running(self) -> bool:
        return any(daemons.is_running(r) for r in self.records())

    def status(self) -> ClusterStatus:
        running = {r.name: daemons.is_running(r) for r in self.records()}
        st = ClusterStatus(root=self.paths.root, running=running, controller_up=False)
        if running.get("slurmctld"):
            client = self.client()
            st.controller_up = client.ping()
            if st.controller_up:
                st.nodes = client.nodes()
                st.jobs = client.jobs()
        return st

    # --- up --------------------------------------------------------------------------------

    def preflight(self) -> dict[str, str]:
        """Find every binary and check every port before anything starts."""
        found: dict[str, str] = {}
        wanted = {**REQUIRED_BINARIES, **(ACCOUNTING_BINARIES if self.spec.accounting else {})}
        for binary, package in wanted.items():
            sbin = self.spec.slurm_sbin
            path = self._which(binary) if sbin is None or binary not in ("slurmctld", "slurmd") \
                else (str(sbin / binary) if (sbin / binary).is_file() else None)
            if path is None:
                raise ClusterError(
                    f"{package} is not installed: '{binary}' not found on PATH "
                    f"(run scripts/setup.sh, or apt-get install {package})")
            found[binary] = path
        if self.is_running():
            raise ClusterError(f"a cluster is already running in {self.paths.root}: "
                               "'malleable cluster down' first")
        ephemeral = ephemeral_ports()
        for owner, port in self.spec.ports.items():
            if port in ephemeral:
                raise ClusterError(
                    f"port {port} for {owner} is among Linux's ephemeral ports "
                    f"({ephemeral.start}-{ephemeral.stop - 1}): an outgoing connection may hold "
                    f"it at any time; choose a --port-base below {ephemeral.start}")
            try:
                check_port_free(self.spec.address, port)
            except OSError as exc:
                raise ClusterError(f"port {port} for {owner} is not free on {self.spec.address}: "
                                   f"{exc.strerror}; choose other ports with --port-base") from exc
        for node in self.spec.node_names:
            if self._cgroup_roots(node):
                raise ClusterError(
                    f"cgroup folders for a node named {node} already exist "
                    f"({', '.join(map(str, self._cgroup_roots(node)))}): another cluster "
                    "uses that node name; choose another --node-prefix or bring it down")
        return found

    @property
    def hooks_dir(self) -> Path:
        return hooks_dir(self.spec)

    def agent_config(self, node: str | None = None):
        """The agent settings the hooks were installed with (hooks/agent.json), as ``node``'s
        agent reads them (its own feed folder on the feed link)."""
        from slurm_plugin.node.config import AgentConfig
        return AgentConfig.from_json((self.hooks_dir / "agent.json").read_text(),
                                     **({} if node is None else {"node": node}))

    def up(self, *, timeout_s: float = 90.0, log: Callable[[str], None] = lambda s: None,
           agents: Policy | None = None) -> None:
        """Start the cluster. ``agents`` names a co-scheduler policy: the Slurm hooks are then
        installed, the watcher and one agent per node started; None runs plain Slurm."""
        agents = None if agents is None else Policy(agents)
        bins = self.preflight()
        if agents is not None:
            self.spec = install_cluster_hooks(self.spec, agents)
        write_cluster_files(self.spec)
        p = self.paths
        records: list[daemons.DaemonRecord] = []

        def start(name: str, argv: list[str], env: dict[str, str] | None = None
                  ) -> daemons.DaemonRecord:
            rec = daemons.start_daemon(name, argv, p.log / f"{name.replace(' ', '-')}.out", env)
            records.append(rec)
            daemons.save_records(p.daemons_file, records)
            log(f"started {name} (pid {rec.pid})")
            return rec

        try:
            start("munged", [bins["munged"], "--foreground", f"--key-file={p.munge_key}",
                             f"--socket={p.munge_socket}", f"--pid-file={p.munge / 'munged.pid'}",
                             f"--log-file={p.log / 'munged.log'}",
                             f"--seed-file={p.munge / 'munged.seed'}"])
            self._wait("munged answering", records, timeout_s, self._munge_ok,
                       log_of={"munged": p.log / "munged.log"})
            if self.spec.accounting:
                self._start_accounting(bins, start, records, timeout_s)
            start("slurmctld", [bins["slurmctld"], "-D", "-c", "-f", str(p.slurm_conf)])
            self._wait("slurmctld answering scontrol ping", records, timeout_s,
                       self.client().ping, log_of={"slurmctld": p.log / "slurmctld.log"})
            for node in self.spec.node_names:
                start(f"slurmd {node}", [bins["slurmd"], "-D", "-f", str(p.slurm_conf), "-N", node])
            self._wait("every node idle", records, timeout_s, self._all_nodes_idle,
                       log_of={f"slurmd {n}": p.log / f"slurmd-{n}.log"
                               for n in self.spec.node_names})
            if agents is not None:
                start("watcher", self._watcher_argv())
                for node in self.spec.node_names:
                    start(f"agent {node}", self._agent_argv(node))
        except BaseException:
            self._stop(records)
            raise
        log(f"cluster up: {len(self.spec.node_names)} nodes in {p.root}"
            + (f", a watcher and an agent per node ({agents.value})" if agents else ""))

    def _start_accounting(self, bins: dict[str, str], start, records, timeout_s: float) -> None:
        """MariaDB on loopback with a database user for slurmdbd (made once, in the cluster's
        folder), then slurmdbd; it answers when sacctmgr can list the clusters."""
        p = self.paths
        if not (p.db / "mysql").is_dir():
            p.db.mkdir(mode=0o700, exist_ok=True)
            self._run([bins["mariadb-install-db"], "--no-defaults", f"--datadir={p.db}",
                       "--user=root", "--auth-root-authentication-method=socket",
                       "--skip-test-db"], timeout=120)
        start("mariadb", [bins["mariadbd"], "--no-defaults", f"--datadir={p.db}",
                          f"--socket={p.db_socket}", f"--port={self.spec.mariadb_port}",
                          f"--bind-address={self.spec.address}", "--user=root",
                          f"--pid-file={p.run / 'mariadb.pid'}",
                          f"--log-error={p.log / 'mariadb.log'}", "--skip-name-resolve",
                          "--skip-log-bin", "--innodb-buffer-pool-size=32M"])
        sql = [bins["mariadb"], "--no-defaults", f"--socket={p.db_socket}", "-u", "root"]

        def db_answers() -> bool:
            try:
                self._run([*sql, "-e", "SELECT 1"], timeout=10)
                return True
            except CommandError:
                return False
        self._wait("MariaDB answering", records, timeout_s, db_answers,
                   log_of={"mariadb": p.log / "mariadb.log"})
        # A new password each start, known to slurmdbd.conf (0600) and the database alone.
        password = os.urandom(18).hex()
        user = f"'{DB_USER}'@'{self.spec.address}'"
        self._run([*sql, "-e", f"CREATE USER IF NOT EXISTS {user}; "
                   f"ALTER USER {user} IDENTIFIED BY '{password}'; "
                   f"GRANT ALL ON {DB_NAME}.* TO {user};"], timeout=30)
        fd = os.open(p.slurmdbd_conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                     0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(render_slurmdbd_conf(self.spec, password))
        # slurmdbd reads slurmdbd.conf from the folder of $SLURM_CONF.
        start("slurmdbd", [bins["slurmdbd"], "-D"],
              env={**os.environ, "SLURM_CONF": str(p.slurm_conf)})

        def dbd_answers() -> bool:
            try:
                self._run(["sacctmgr", "-n", "-P", "list", "cluster"], timeout=10,
                          env=self.env())
                return True
            except CommandError:
                return False
        self._wait("slurmdbd answering sacctmgr", records, timeout_s, dbd_answers,
                   log_of={"slurmdbd": p.log / "slurmdbd.log"})

    def agent_args(self, node: str) -> list[str]:
        """The agent's options on ``node``: its config, node and metrics port."""
        return ["--config", str(self.hooks_dir / "agent.json"), "--node", node,
                "--metrics-port", str(self.spec.metrics_port(node)), "--metrics-per-job"]

    def _agent_argv(self, node: str) -> list[str]:
        return [sys.executable, "-m", "slurm_plugin.commands.main", "agent",
                *self.agent_args(node)]

    def restart_agent(self, node: str, env: dict[str, str] | None = None,
                      argv: list[str] | None = None) -> daemons.DaemonRecord:
        """Start ``node``'s agent again (what its service manager does after a crash), after
        stopping the one recorded if it still runs. ``env`` is added to its environment;
        ``argv`` replaces the command (a test's agent with a fault hook, given agent_args)."""
        return self._restart(f"agent {node}", argv or self._agent_argv(node), env)

    def restart_watcher(self) -> daemons.DaemonRecord:
        """Start the watcher again, after stopping the one recorded if it still runs."""
        return self._restart("watcher", self._watcher_argv())

    def stop_daemons(self, names: Iterable[str]) -> None:
        """Stop the recorded daemons of these names (an agent's or the watcher's crash); their
        records stay, for ``restart_agent`` and ``restart_watcher``."""
        wanted = set(names)
        for rec in self.records():
            if rec.name in wanted:
                daemons.stop_daemon(rec)
        daemons.reap_children()

    def _restart(self, name: str, argv: list[str], env: dict[str, str] | None = None
                 ) -> daemons.DaemonRecord:
        records = self.records()
        for old in (r for r in records if r.name == name):
            daemons.stop_daemon(old)
        daemons.reap_children()
        rec = daemons.start_daemon(name, argv, self.paths.log / f"{name.replace(' ', '-')}.out",
                                   env={**os.environ, **(env or {})})
        daemons.save_records(self.paths.daemons_file,
                             [r for r in records if r.name != name] + [rec])
        return rec

    def _watcher_argv(self) -> list[str]:
        link = ["--config", str(self.hooks_dir / "agent.json"),
                "--link-address", self.spec.address] if self.spec.feed_link else []
        return [sys.executable, "-m", "slurm_plugin.commands.main", "watcher",
                "--feed-dir", str(self.paths.root / "feed"),
                "--slurm-conf", str(self.paths.slurm_conf),
                "--metrics-port", str(self.spec.watcher_metrics_port), *link]

    def _munge_ok(self) -> bool:
        try:
            cred = self._run(["munge", "-n", "-S", str(self.paths.munge_socket)], timeout=5).stdout
            self._run(["unmunge", "-S", str(self.paths.munge_socket)], input=cred, timeout=5)
            return True
        except CommandError:
            return False

    def _all_nodes_idle(self) -> bool:
        try:
            nodes = self.client().nodes()
        except (CommandError, ValueError):
            return False
        names = {n.name for n in nodes if n.is_idle}
        return set(self.spec.node_names) <= names

    def _wait(self, what: str, records: list[daemons.DaemonRecord], timeout_s: float,
              ready: Callable[[], bool], log_of: dict[str, Path]) -> None:
        deadline = self._clock() + timeout_s
        while True:
            daemons.reap_children()
            for rec in records:
                if not daemons.is_running(rec):
                    logfile = log_of.get(rec.name, Path(rec.log))
                    raise ClusterError(
                        f"{rec.name} exited while waiting for {what}. Last lines of {logfile}:\n"
                        f"{daemons.tail(logfile)}\nand of {rec.log}:\n{daemons.tail(rec.log, 5)}")
            if ready():
                return
            if self._clock() > deadline:
                tails = "\n".join(f"--- {name}: {path}\n{daemons.tail(path)}"
                                  for name, path in log_of.items())
                raise ClusterError(f"timed out after {timeout_s:g}s waiting for {what}\n{tails}")
            self._sleep(0.2)

    # --- down ------------------------------------------------------------------------------

    def down(self, *, cancel_jobs: bool = True) -> list[str]:
        """Stop the cluster's daemons and its jobs; remove its cgroup folders. Returns problems
        that could not be fixed (empty when everything is clean)."""
        records = self.records()
        problems: list[str] = []
        ctld = next((r for r in records if r.name == "slurmctld"), None)
        if cancel_jobs and ctld is not None and daemons.is_running(ctld):
            try:
                jobs = self.client().jobs()
                if jobs:
                    self._run(["scancel", *[str(j.job_id) for j in jobs]], timeout=20,
                              env=self.env())
                    self._wait_jobs_gone(timeout_s=15.0)
            except (CommandError, ValueError) as exc:
                problems.append(f"could not cancel jobs: {exc}")
        self._stop(records, problems)
        # Job tasks and slurmstepd processes (they daemonize away from slurmd) still alive are
        # found by their membership in the nodes' cgroups, never by name.
        for node in self.spec.node_names:
            for root in self._cgroup_roots(node):
                report = cgroups.remove_cgroup_tree(root)
                problems += [f"cgroup {path} not removed: {why}" for path, why in report.failed]
        problems += self._unmount_job_folders()
        if not problems and self.paths.daemons_file.exists():
            self.paths.daemons_file.unlink()
        return problems

    def _unmount_job_folders(self) -> list[str]:
        """The tmpfs of each job folder whose Epilog never ran (a job cut short by down)."""
        jobs = str(self.run_layout.jobs_dir) + "/"
        points = [m.point for m in node_mounts() if m.point.startswith(jobs)]
        problems = []
        for point in points:
            try:
                unmount_job_fs(Path(point))
            except (OSError, CommandError) as exc:
                problems.append(f"job folder {point} not unmounted: {exc}")
        return problems

    def _cgroup_roots(self, node: str) -> list[Path]:
        """The folders this cluster's slurmd for ``node`` makes: named after it (Debian's
        multiple-slurmd build), or the host's one slurmd's (another build, ``slurm_sbin``)."""
        return cgroups.made_roots(node, multiple_slurmd=self.spec.slurm_sbin is None)

    def _wait_jobs_gone(self, timeout_s: float) -> None:
        deadline = self._clock() + timeout_s
        client = self.client()
        while self._clock() < deadline:
            try:
                if not any(j.state.holds_cores for j in client.jobs()):
                    return
            except (CommandError, ValueError):
                return
            self._sleep(0.2)

    def _stop(self, records: list[daemons.DaemonRecord], problems: list[str] | None = None) -> None:
        # Compute daemons first, then the controller, then munge which they all use.
        # slurmctld sends what it still holds to slurmdbd, which writes it to MariaDB.
        order = {"munged": 4, "mariadb": 3, "slurmdbd": 2, "slurmctld": 1}
        for rec in sorted(records, key=lambda r: order.get(r.name, 0)):
            if not daemons.stop_daemon(rec) and problems is not None:
                problems.append(f"{rec.name} (pid {rec.pid}) did not stop")
