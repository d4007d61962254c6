"""What a hostile job user could do to the root side's ports and files: take the metrics port
first (the agent starts and reconciles anyway, and serves once the port is free), read other
users' targets, feed files, event log or status rows (refused)."""
import os
import pwd
import socket
import stat
import sys
import urllib.request

import pytest

from slurm_plugin.daemon import agent as agent_mod
from slurm_plugin.node.config import AgentConfig
from slurm_plugin.daemon.metrics import AgentMetrics, MetricsServer
from slurm_plugin.feed.store import FeedStore

from .fakes import feed_of_three_jobs


def _taken_port() -> socket.socket:
    """A listening socket on an ephemeral loopback port, as a job user would hold it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def test_a_taken_metrics_port_is_retried_until_it_is_free():
    squatter = _taken_port()
    port = squatter.getsockname()[1]
    server = MetricsServer(AgentMetrics("n1"), port, retry_s=0.05)
    try:
        assert server.start() is False                 # no exception: the agent runs on
        assert server.bind_failures >= 1 and not server.bound
        squatter.close()
        assert server.wait_bound(10), "never bound once the port was free"
        text = _scrape(port)
        assert 'malleable_metrics_bind_failures_total{node="n1"}' in text
    finally:
        squatter.close()
        server.stop()
    # stopped: the port is free again (its scrape's connection may linger in TIME_WAIT)
    again = socket.socket()
    again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        again.bind(("127.0.0.1", port))
    finally:
        again.close()


def test_no_thread_before_start_and_a_free_port_binds_at_once():
    probe = _taken_port()
    port = probe.getsockname()[1]
    probe.close()
    server = MetricsServer(AgentMetrics("n1"), port, retry_s=0.05)
    assert server._thread is None and not server.bound
    try:
        assert server.start() is True and server._thread is None
        assert "malleable_cycle_seconds" in _scrape(port)
    finally:
        server.stop()
    with pytest.raises(ValueError):
        MetricsServer(AgentMetrics("n1"), port, retry_s=0)


def test_run_agent_starts_and_reconciles_while_a_user_holds_its_metrics_port(tmp_path,
                                                                             monkeypatch):
    """run_agent with its metrics port taken: it does not raise, it cycles, and it binds the
    port once the user lets it go."""
    squatter = _taken_port()
    port = squatter.getsockname()[1]
    seen = {}

    class FakeRec:
        on_cycle = None
        store = FeedStore(tmp_path / "feed")

        def run(self, stop, wake=None, serve=None, feed_changed=None):
            seen["on_cycle"] = self.on_cycle
            squatter.close()
            seen["server"] = server = _servers[-1]
            seen["bound"] = server.wait_bound(10)
            seen["scrape"] = _scrape(port) if seen["bound"] else ""

    _servers = []
    real_start = agent_mod.start_metrics

    def start_metrics(*a, **kw):
        s = real_start(*a, **kw)
        _servers.append(s)
        seen["bound_at_start"] = s.bound
        return s

    monkeypatch.setattr(agent_mod, "await_layout", lambda config, wait_s: _Layout())
    monkeypatch.setattr(agent_mod, "make_reconciler", lambda config, layout, **kw: FakeRec())
    monkeypatch.setattr(agent_mod, "start_metrics", start_metrics)
    config = AgentConfig(node="n1", state_dir=tmp_path, feed_dir=tmp_path / "feed")
    try:
        assert agent_mod.run_agent(config, metrics_port=port, metrics_retry_s=0.05) == 0
    finally:
        squatter.close()
    assert seen["bound_at_start"] is False
    assert seen["on_cycle"] is not None and seen["bound"], seen
    assert "malleable_metrics_bind_failures_total" in seen["scrape"]
    assert not seen["server"].bound or seen["server"]._server is None   # stopped on exit


class _Layout:
    def describe(self):
        return "fake"


def test_the_agent_command_takes_a_metrics_address():
    from slurm_plugin.commands.main import build_parser
    args = build_parser().parse_args(["agent", "--config", "a.json", "--metrics-port", "9100"])
    assert args.metrics_address == "127.0.0.1" and args.metrics_port == 9100
    args = build_parser().parse_args(["agent", "--config", "a.json", "--metrics-port", "9100",
                                      "--metrics-addr", "10.1.2.3"])   # the older spelling
    assert args.metrics_address == "10.1.2.3"
    for bad in (["--metrics-address", "example.org"], ["--metrics-port", "70000"],
                ["--metrics-retry", "0"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["agent", "--config", "a.json", *bad])


# --- targets: root's file, readable by the job's user alone --------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changes owners and uids: run as root")

JOB_UID, STRANGER_UID = 65534, 65533     # nobody, and another uid in nobody's group


def _read(path) -> bool:
    with open(path, "rb") as f:
        f.read()
    return True


def _can_read_as(uid: int, gid: int, path, read=_read) -> bool:
    """Whether a process of ``uid`` (group ``gid``, no others) can read ``path`` (or do what
    ``read`` does with it: any error is a no)."""
    pid = os.fork()
    if pid == 0:     # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            code = 0 if read(path) else 1
        except BaseException:  # noqa: BLE001 - a forked child: exit with its code, whatever
            pass
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _shrink_action(uid: int):
    from malleable_policy.model import Action, ActionKind, Reason
    return Action(kind=ActionKind.SHRINK, job_id=42, uid=uid, allocation=frozenset({0}),
                  before=frozenset({0, 1}), after=frozenset({0}), threads_per_rank=(1,),
                  reason=Reason.REQUEST)


def _executor(tmp_path):
    from malleable_protocol import RunLayout
    from slurm_plugin.node.executor import PlanExecutor
    return PlanExecutor("n1", RunLayout(tmp_path / "run"), actuator=None)


@pytest.fixture
def open_tmp():
    """A folder every user can traverse (pytest's own tmp_path is root's alone)."""
    import shutil
    import tempfile
    from pathlib import Path
    d = Path(tempfile.mkdtemp(prefix="malleable-privacy-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


@needs_root
def test_a_target_is_roots_and_readable_by_the_jobs_user_alone(open_tmp):
    from malleable_protocol import RunLayout, Target
    from malleable_protocol.safe_io import read_bounded
    tmp_path = open_tmp
    _executor(tmp_path)._write_target(_shrink_action(JOB_UID))
    path = RunLayout(tmp_path / "run").target_file(42, "n1")
    st = os.stat(path)
    assert (st.st_uid, st.st_gid) == (0, 0)           # the user does not own it: no chmod
    assert stat.S_IMODE(st.st_mode) & 0o007 == 0      # nothing for others
    assert "system.posix_acl_access" in os.listxattr(path)
    assert Target.decode(read_bounded(path, 4096)).cpus == frozenset({0})
    nogroup = pwd.getpwuid(JOB_UID).pw_gid
    # The job's ranks read it, as malleable_tf does:
    from malleable_runtime.control import load_target
    assert _can_read_as(JOB_UID, nogroup, path,
                        read=lambda p: load_target(p).cpus == frozenset({0}))
    assert not _can_read_as(STRANGER_UID, nogroup, path)      # same group, another user: no
    assert not _can_read_as(STRANGER_UID, 0, path)            # root's group, another user: no
    # and its user can neither write it nor change its mode
    assert not _can_read_as(JOB_UID, nogroup, path,
                            read=lambda p: os.close(os.open(p, os.O_WRONLY)) or True)
    assert not _can_read_as(JOB_UID, nogroup, path, read=lambda p: os.chmod(p, 0o666) or True)


@needs_root
def test_without_acls_a_target_falls_back_to_the_users_primary_group(tmp_path, monkeypatch):
    """A filesystem without POSIX ACLs: root:<primary gid> 0640; no passwd entry: root's only."""
    import errno

    from malleable_protocol import safe_io

    def no_acl(*a, **kw):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")
    monkeypatch.setattr(safe_io.os, "setxattr", no_acl)
    f = tmp_path / "f"
    fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert safe_io.share_read_with(fd, 4242, primary_gid=lambda uid: 777) == "group"
        st = os.fstat(fd)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 777, 0o640)
        assert safe_io.share_read_with(fd, 4243, primary_gid=lambda uid: None) == "owner"
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
        assert safe_io.share_read_with(fd, 0) == "self"
    finally:
        os.close(fd)


# --- the event log and the feed: root's alone --------------------------------------------

def test_the_event_log_is_roots_alone_even_one_an_older_version_made(tmp_path):
    from types import SimpleNamespace

    from slurm_plugin.node.reconciler import Reconciler
    fake = SimpleNamespace(config=SimpleNamespace(event_log=tmp_path / "events-n1.jsonl"))
    Reconciler._log_event(fake, {"job": 1, "status": "applied"})
    assert stat.S_IMODE(os.stat(tmp_path / "events-n1.jsonl").st_mode) == 0o600
    old = tmp_path / "events-n2.jsonl"
    old.write_text("")
    old.chmod(0o644)
    fake.config.event_log = old
    Reconciler._log_event(fake, {"job": 1, "status": "applied"})
    assert stat.S_IMODE(old.stat().st_mode) == 0o600 and '"job": 1' in old.read_text()


def test_feed_folders_and_files_are_roots_alone(tmp_path):
    from slurm_plugin.feed import FeedStore, NodeReport, Offers
    feed = tmp_path / "feed"
    feed.mkdir(mode=0o755)
    (feed / "nodes").mkdir(mode=0o755)            # as an older version left them
    (feed / "events").write_text("")
    (feed / "events").chmod(0o664)
    store = FeedStore(feed)
    store.prepare()
    feed_of_three_jobs(store)
    store.write_offers(Offers("n1", {1: 2}))
    store.write_report(NodeReport("n1"))
    assert stat.S_IMODE(feed.stat().st_mode) == 0o711        # SlurmUser reaches events by name
    for d in ("nodes", "offers", "reports"):
        assert stat.S_IMODE((feed / d).stat().st_mode) == 0o700
        for f in (feed / d).iterdir():
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert stat.S_IMODE((feed / "events").stat().st_mode) == 0o660   # its group kept, no others
    (feed / "events").unlink()
    store.prepare()
    assert stat.S_IMODE((feed / "events").stat().st_mode) == 0o600


def test_the_watcher_rotates_events_keeping_its_owner_and_mode(tmp_path):
    from slurm_plugin.feed import ClusterWatcher, FeedStore, WatcherConfig
    store = FeedStore(tmp_path)
    store.prepare()
    store.events_file.write_text("x" * 100)
    os.chown(store.events_file, 4321, 4322)        # SlurmUser's, as a site sets it
    store.events_file.chmod(0o640)
    w = ClusterWatcher(WatcherConfig(feed_dir=tmp_path, events_max_bytes=10), None, store)
    w._rotate_events()
    st = store.events_file.stat()
    assert (st.st_size, st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 4321, 4322, 0o640)
    assert (tmp_path / "events.1").read_text() == "x" * 100


def test_status_shows_a_user_only_his_own_jobs_and_root_all(tmp_path, capsys):
    import argparse
    import json

    from slurm_plugin.commands.status import run as _status_cmd
    from slurm_plugin.commands.status import collect_status
    from slurm_plugin.feed import FeedStore, NodeReport
    store = FeedStore(tmp_path)
    store.prepare()
    feed_of_three_jobs(store)
    store.write_report(NodeReport("n1", problems=("job 2 of bob: cgroup folder elsewhere",)))
    assert [r.job_id for r in collect_status(store)] == [1, 2]
    assert [r.job_id for r in collect_status(store, uid=1000)] == [1]
    assert [r.job_id for r in collect_status(store, only_malleable=False, uid=1000)] == [1, 3]
    args = argparse.Namespace(feed_dir=str(tmp_path), all=False, json=True)
    assert _status_cmd(args, uid=1001) == 0                    # no node problem for a user
    out = capsys.readouterr()
    assert [r["job_id"] for r in json.loads(out.out)] == [2] and "PROBLEM" not in out.err
    assert _status_cmd(args, uid=0) == 1                       # root: all, and the problem
    out = capsys.readouterr()
    assert [r["job_id"] for r in json.loads(out.out)] == [1, 2] and "bob" in out.err


@needs_root
def test_status_run_by_a_user_refuses_clearly_when_the_feed_is_roots(open_tmp):
    from slurm_plugin.commands.main import main
    from slurm_plugin.feed import FeedStore
    store = FeedStore(open_tmp / "feed")
    store.prepare()
    feed_of_three_jobs(store)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:     # pragma: no cover - the child, as nobody
        code = 99
        try:
            os.close(r)
            sys.stderr = os.fdopen(w, "w")
            os.setgroups([])
            os.setgid(65534)
            os.setuid(JOB_UID)
            # No Slurm here to list his own jobs (no squeue on PATH): the error says both.
            os.environ["PATH"] = str(open_tmp / "no-bin")
            code = main(["status", "--feed-dir", str(store.feed_dir),
                         "--config", str(open_tmp / "no-agent.json")])
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        err = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1, err      # a runtime error, not usage
    assert err.startswith("malleable status: cannot read the feed")
    assert "only root may read it" in err and "squeue not found on PATH" in err
    assert not _can_read_as(JOB_UID, 65534, store.nodes_dir / "n1.json")


def test_status_of_a_feed_folder_that_is_not_there_is_an_error(tmp_path, capsys):
    """A wrong --feed-dir printed an empty table and exited 0."""
    from slurm_plugin.commands.main import main
    assert main(["status", "--feed-dir", str(tmp_path / "missing")]) == 1
    assert "no feed folder at" in capsys.readouterr().err


def test_the_command_tells_its_version(capsys):
    from importlib.metadata import version

    from slurm_plugin.commands.main import main
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"malleable {version('malleable-hpc')}"


def test_the_agents_metrics_name_no_job_unless_the_site_asks():
    """Any local user can scrape a loopback port; a list of job ids is what Slurm's
    PrivateData=jobs hides. Without --metrics-per-job the node's totals are served only."""
    from types import SimpleNamespace
    from prometheus_client import generate_latest
    from slurm_plugin.commands.main import build_parser
    job = SimpleNamespace(job_id=4242, allocation=frozenset({0}))
    cycle = SimpleNamespace(seconds=0.01, applied=[], failures=[],
                            snapshot=SimpleNamespace(jobs=[job], problems=[], faults=[]),
                            plan=SimpleNamespace(targets={4242: frozenset({0, 1})}),
                            usage={4242: SimpleNamespace(borrowed_core_s=1.0, lent_core_s=0.0)})
    texts = {}
    for per_job in (False, True):
        metrics = AgentMetrics("n1", per_job=per_job)
        metrics.observe(cycle)
        texts[per_job] = generate_latest(metrics.registry).decode()
    assert "4242" not in texts[False] and 'malleable_jobs{node="n1"} 1.0' in texts[False]
    assert 'job="4242"' in texts[True]
    args = build_parser().parse_args(["agent", "--config", "a.json", "--metrics-port", "9100"])
    assert args.metrics_per_job is False


def test_status_reads_the_feed_the_install_left_on_this_host(tmp_path, capsys):
    """docs/install.md's layout: the watcher's folder on the controller, each node's own copy
    of its feed on the node; `malleable status` without --feed-dir reads agent.json's."""
    import json

    from slurm_plugin.commands.main import main
    from slurm_plugin.commands.status import feed_dir_here, installed_config
    from slurm_plugin.feed import FeedStore
    from slurm_plugin.settings import DEFAULT_FEED_DIR
    agent_json = tmp_path / "agent.json"
    config = AgentConfig(node="n1", feed_dir=tmp_path / "node-feed", feed_link_hosts=("ctl",),
                         watcher_dir=tmp_path / "watcher")
    agent_json.write_text(config.to_json())
    assert feed_dir_here(installed_config(agent_json)) == tmp_path / "node-feed"      # no watcher ran here
    store = FeedStore(tmp_path / "watcher")
    store.prepare()
    feed_of_three_jobs(store)
    assert feed_dir_here(installed_config(agent_json)) == tmp_path / "watcher"
    assert feed_dir_here(installed_config(tmp_path / "missing.json")) == DEFAULT_FEED_DIR
    if os.geteuid() == 0:       # root's view: every malleable job of the watcher's feed
        assert main(["status", "--config", str(agent_json), "--json"]) == 0
        assert [r["job_id"] for r in json.loads(capsys.readouterr().out)] == [1, 2]


def test_status_takes_squeues_job_and_user_options(tmp_path, capsys):
    """-j, -u (names or uids) and --me as squeue has them; a user other than root still sees
    only his own jobs whatever he asks for."""
    import json

    from slurm_plugin.commands.main import build_parser
    from slurm_plugin.commands.status import run as status
    from slurm_plugin.feed import FeedStore
    store = FeedStore(tmp_path)
    store.prepare()
    feed_of_three_jobs(store)

    def shown(argv: list[str], uid: int) -> list[int]:
        args = build_parser().parse_args(["status", "--feed-dir", str(tmp_path), "--json",
                                          *argv])
        assert status(args, uid=uid) == 0
        return [r["job_id"] for r in json.loads(capsys.readouterr().out)]

    assert shown(["-u", "1001"], uid=0) == [2]
    assert shown(["-u", "1000,1001", "--all"], uid=0) == [1, 2, 3]
    assert shown(["-j", "2,3"], uid=0) == [2, 3]          # asked by id: rigid ones too
    assert shown(["--me"], uid=0) == []                   # root runs no job here
    assert shown(["--me"], uid=1000) == [1]
    assert shown(["-u", "1001"], uid=1000) == []          # bob's, asked by alice: none
    assert shown(["-u", "root"], uid=0) == []
    with pytest.raises(SystemExit):
        build_parser().parse_args(["status", "-u", "no-such-user-here"])
    args = build_parser().parse_args(["status", "--feed-dir", str(tmp_path), "-j", "9"])
    with pytest.raises(Exception, match="no job 9 in the feed"):
        status(args, uid=0)


def test_a_user_without_the_feed_sees_his_own_jobs_on_this_node(tmp_path, capsys):
    """The feed is root's: a user's `malleable status` shows his own jobs on this node, from
    his jobs' targets (root's, readable by each job's user alone) and his ranks' records; which
    jobs are his, Slurm says (squeue --me)."""
    import argparse
    import json

    from malleable_protocol import RankStatus, RunLayout, Target
    from slurm_plugin.commands.status import own_rows_here
    from slurm_plugin.commands.status import run as status
    layout = RunLayout(tmp_path / "run")
    layout.targets_dir.mkdir(parents=True)
    layout.target_file(7, "n1").write_bytes(Target(frozenset({0, 1, 2})).encode())
    layout.job_dir(7).mkdir(parents=True)
    layout.status_file(7, 0, "step_batch").write_bytes(RankStatus(
        pid=1, rank=0, local_rank=0, local_size=1, intra_active=3, intra_pool=4,
        inter_active=1, inter_pool=1, steps_per_s={3: 12.5}).encode())
    rows = own_rows_here(layout, "n1", [7, 8], "alice", 1000)
    assert [(r.job_id, r.current_cpus, r.threads, r.steps_per_s, r.uid) for r in rows] == \
        [(7, "0-2", [3], [12.5], 1000)]          # job 8: no target, no record here
    agent_json = tmp_path / "agent.json"
    agent_json.write_text(AgentConfig(node="n1", run_dir=tmp_path / "run").to_json())
    asked = []

    def squeue(argv, **kw):
        asked.append(argv)
        return argparse.Namespace(stdout="7\n")
    args = argparse.Namespace(feed_dir=str(tmp_path / "no-feed"), config=str(agent_json),
                              node="n1", json=True, all=False, job_id=None, jobs=None,
                              user=None, me=False)
    assert status(args, uid=1000, runner=squeue) == 0
    out = capsys.readouterr()
    assert [r["job_id"] for r in json.loads(out.out)] == [7]
    assert "your jobs on n1 only" in out.err
    assert asked == [["squeue", "--me", "--noheader", "--states=RUNNING", "--nodelist=n1",
                      "--format=%A"]]

