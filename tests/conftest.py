"""Shared fixtures. The integration tests run on real Slurm mini-clusters on this machine."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from slurm_plugin.cluster import LocalCluster, daemons, default_spec
from slurm_plugin.logs import STACKS_SIGNAL


def make_cluster_root(prefix: str) -> Path:
    # Not pytest's tmp_path: munged needs every folder above its socket to be traversable by
    # all users, and /tmp/pytest-of-root is private.
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(root, 0o755)
    return root


def _log_order(path: Path) -> tuple[int, str]:
    """The watcher's and slurmctld's logs first, munged's (long and rarely the cause) last: CI
    shows only part of a long report."""
    first = ("watcher", "slurmctld", "agent-")
    rank = next((i for i, p in enumerate(first) if path.name.startswith(p)), len(first))
    return (len(first) + 1 if path.name.startswith("munged") else rank, path.name)


def _slurm_view(c: LocalCluster) -> str:
    """Slurm's own view when the test failed: every job and its state or reason, and the
    nodes that are not up (a job that never started shows as pending here, not in the logs)."""
    out = []
    for argv in (["squeue", "-a", "-o", "%i %u %T %R %M %C %j"], ["sinfo", "-R", "-N"]):
        try:
            r = subprocess.run(argv, env={**os.environ, **c.env()}, capture_output=True,
                               text=True, timeout=20)
            out.append(f"$ {' '.join(argv)}\n{r.stdout.rstrip()}{r.stderr.rstrip()}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            out.append(f"$ {' '.join(argv)}: {exc}")
    return "\n".join(out)


def cluster_log_tails(c: LocalCluster, lines: int = 25) -> str:
    """Slurm's view of the jobs and nodes, which of the cluster's daemons still run, and the
    last lines of their logs, of the agents' event logs and of the hooks' logs: what a failed
    test shows, since the cluster's folder goes with the cluster."""
    daemons.reap_children()
    alive = ", ".join(f"{r.name} (pid {r.pid}): {'running' if daemons.is_running(r) else 'gone'}"
                      for r in c.records())
    agent = c.paths.root / "agent"
    logs = sorted(list(c.paths.log.glob("*.out")) + list(c.paths.log.glob("*.log")),
                  key=_log_order) + \
        sorted(agent.glob("events-*.jsonl")) + sorted(agent.glob("hooks-*.log"))
    # What each agent decided from: the nodes' feeds as the watcher wrote them and as each
    # node's copy has them, and each agent's ledger (allocations, jobs ended or starting).
    state = sorted(c.paths.root.glob("feed/nodes/*")) + \
        sorted(c.paths.root.glob("node-feed/*/nodes/*")) + \
        sorted(c.paths.root.glob("**/ledger-*.json"))
    return "\n".join([_slurm_view(c), f"daemons: {alive}"] +
                      [f"--- {path}\n{daemons.tail(path, lines)}" for path in logs] +
                      [f"--- {path}\n{_head(path)}" for path in state] +
                      _daemon_stacks(c))


def _head(path: Path, limit: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError as exc:
        return f"({exc})"


def _catches(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler for ``signum`` (SigCgt in /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) >> (signum - 1) & 1)


def _daemon_stacks(c: LocalCluster, lines: int = 80) -> list[str]:
    """Every thread's Python stack of the cluster's agents and watcher (STACKS_SIGNAL: what
    each printed into its log after it), so that a daemon that stopped acting shows where
    it waits. Shown after the logs' tails, which it would otherwise push out."""
    asked = []
    for r in c.records():
        if (r.name == "watcher" or r.name.startswith("agent")) and daemons.is_running(r):
            try:
                if not _catches(r.pid, STACKS_SIGNAL):
                    continue        # still starting: the signal's default would end it
                before = os.stat(r.log).st_size
                os.kill(r.pid, STACKS_SIGNAL)
            except OSError:
                continue
            asked.append((r, before))
    if not asked:
        return []
    time.sleep(1.0)
    out = []
    for r, before in asked:
        try:
            with open(r.log, "rb") as f:
                f.seek(before)
                text = f.read(256 * 1024).decode(errors="replace")
        except OSError as exc:
            text = f"({exc})"
        kept = "\n".join(text.rstrip().splitlines()[:lines])
        out.append(f"--- {r.name} (pid {r.pid}): its threads' stacks "
                   f"({signal.Signals(STACKS_SIGNAL).name})\n{kept}")
    return out


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test on a cluster that fails gets the cluster's log tails in its report."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for name in ("agent_cluster", "cluster"):
        c = getattr(item, "funcargs", {}).get(name)
        if isinstance(c, LocalCluster):
            report.sections.append((f"{name}: the daemons' logs", cluster_log_tails(c)))


def pytest_terminal_summary(terminalreporter):
    """The waits that held after more than half their time (integration.helpers.wait_for)."""
    from .integration.helpers import SLOW_WAITS
    if not SLOW_WAITS:
        return
    terminalreporter.section("waits that took more than half their time")
    for w in sorted(SLOW_WAITS, key=lambda w: w.seconds / w.timeout, reverse=True):
        terminalreporter.write_line(f"{w.seconds:6.1f} s of {w.timeout:5.0f} s  {w.what}  "
                                    f"({w.test})")


@contextmanager
def running_cluster(prefix: str, *, agents: str | None = None, **spec):
    """A cluster up for the block, then down: no process, cgroup folder or file left."""
    root = make_cluster_root(prefix)
    c = LocalCluster(default_spec(root, **spec))
    c.up(timeout_s=120, agents=agents)
    try:
        yield c
    finally:
        problems = c.down()
        shutil.rmtree(root, ignore_errors=True)
        assert not problems, problems


@pytest.fixture(scope="session")
def cluster():
    """A 3-node cluster for the whole session, on ports and node names of its own."""
    with running_cluster("malleable-test-", nodes=3, node_prefix="tn", name="malleabletest",
                         port_base=int(os.environ.get("MALLEABLE_TEST_PORT", 15817))) as c:
        yield c


@pytest.fixture
def cpuset_cgroup():
    """A cpuset cgroup of our own (cgroup v1, as on this machine), removed afterwards: a
    framework's process joins it and the test changes its cpus."""
    root = Path("/sys/fs/cgroup/cpuset")
    path = root / f"malleable_test_{os.getpid()}"
    path.mkdir()
    (path / "cpuset.mems").write_text((root / "cpuset.mems").read_text())
    (path / "cpuset.cpus").write_text((root / "cpuset.cpus").read_text())
    yield path
    for pid in (path / "cgroup.procs").read_text().split():
        try:
            (root / "cgroup.procs").write_text(pid)
        except OSError:
            pass
    path.rmdir()
