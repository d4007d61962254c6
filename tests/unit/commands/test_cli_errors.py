"""The ``malleable`` command's exit codes and messages (0 done, 1 could not be done with one line
``malleable <command>: ...`` on stderr, 2 usage), ``--version``, ``--metrics-address``, the one
logging set-up, and malleable_tf's resize lines by rank."""
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from slurm_plugin.cluster import LocalCluster
from slurm_plugin.commands import common
from slurm_plugin.commands import main as cli
from slurm_plugin.commands.main import build_parser, main
from slurm_plugin.cluster import ClusterError
from slurm_plugin.feed import FeedStore, NodeReport
from slurm_plugin.logs import STACKS_SIGNAL, setup_logging
from slurm_plugin.slurm import UnknownJob
from malleable_protocol.runner import CommandError

from ..fakes import World, fake_tf_adapter, feed_of_three_jobs

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _restore_logging():
    """Commands set the root logger up; each test leaves it as it found it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(h)
    root.setLevel(level)


def _fails(capsys, argv, command, *parts):
    """``argv`` exits 1 with one stderr line ``malleable <command>: ...`` holding ``parts``."""
    assert main(argv) == 1
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith(f"malleable {command}: "), err
    for part in parts:
        assert part in first, err
    return err


def _usage(capsys, argv, *parts):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    for part in parts:
        assert part in err, err
    return err


# --- --version -------------------------------------------------------------------------------

def test_version_is_the_installed_distributions(capsys):
    from importlib.metadata import version
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"malleable {version('malleable-hpc')}\n"


def test_version_falls_back_to_pyproject_when_not_installed(monkeypatch):
    import importlib.metadata as md
    import tomllib

    def not_installed(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "version", not_installed)
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert cli.package_version() == expected


def test_version_in_a_real_process():
    out = subprocess.run([sys.executable, "-m", "slurm_plugin.commands.main", "--version"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("malleable ") and out.stdout.split()[1][0].isdigit()


# --- status ----------------------------------------------------------------------------------

def test_status_of_a_missing_feed_folder(tmp_path, capsys):
    _fails(capsys, ["status", "--feed-dir", str(tmp_path / "missing")], "status",
           f"no feed folder at {tmp_path / 'missing'}", "--feed-dir")


def test_status_of_a_feed_folder_with_no_node_yet(tmp_path, capsys):
    FeedStore(tmp_path / "feed").prepare()
    err = _fails(capsys, ["status", "--feed-dir", str(tmp_path / "feed")], "status",
                 "holds no node's feed yet", "malleable watcher")
    assert "no feed folder" not in err                      # told apart from a missing one
    (tmp_path / "bare").mkdir()                              # not even the watcher's folders
    _fails(capsys, ["status", "--feed-dir", str(tmp_path / "bare")], "status",
           "holds no node's feed yet")


def test_status_of_one_job(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    store = FeedStore(tmp_path / "feed")
    store.prepare()
    feed_of_three_jobs(store)
    base = ["status", "--feed-dir", str(store.feed_dir), "--json"]
    assert main(base) == 0
    assert [r["job_id"] for r in json.loads(capsys.readouterr().out)] == [1, 2]
    assert main([*base, "2"]) == 0
    assert [r["job_id"] for r in json.loads(capsys.readouterr().out)] == [2]
    assert main([*base, "3"]) == 0                           # a rigid job, when named
    assert [r["job_id"] for r in json.loads(capsys.readouterr().out)] == [3]
    _fails(capsys, [*base, "99"], "status", "no job 99 in the feed at", "squeue")
    store.write_report(NodeReport("n1", problems=("job 2: cgroup folder elsewhere",)))
    assert main([*base, "1"]) == 1                           # its node's problem: still exit 1
    assert "PROBLEM node n1" in capsys.readouterr().err


def test_status_usage_errors_exit_2(capsys):
    _usage(capsys, ["status", "abc"], "not a Slurm job id")
    _usage(capsys, ["status", "0"], "not a Slurm job id")
    _usage(capsys, ["no-such-command"], "invalid choice")


# --- the other commands' runtime errors ------------------------------------------------------

def test_no_cluster(tmp_path, capsys):
    for action in ("status", "down", "env"):
        _fails(capsys, ["cluster", action, "--dir", str(tmp_path / "none")], "cluster",
               "no cluster at", "malleable cluster up")


def test_cluster_status_of_a_stopped_cluster(tmp_path, capsys, monkeypatch):
    from slurm_plugin.cluster.local import ClusterStatus

    class Stopped:
        def status(self):
            return ClusterStatus(root=tmp_path, running={}, controller_up=False)

    class HalfUp:
        def status(self):
            return ClusterStatus(root=tmp_path, running={"slurmctld": True, "slurmd n1": False},
                                 controller_up=True)

    for fake, part in ((Stopped, "no cluster running in"), (HalfUp, "daemon(s) down in")):
        monkeypatch.setattr(LocalCluster, "load", classmethod(lambda cls, root: fake()))
        assert main(["cluster", "status", "--dir", str(tmp_path)]) == 1
        out = capsys.readouterr()
        assert out.err.startswith(f"malleable cluster: {part}"), out.err
        assert out.out.startswith("cluster folder:")         # the status is still printed


def test_a_multi_line_error_is_one_line_then_its_detail(tmp_path, capsys, monkeypatch):
    def load(cls, root):
        raise ClusterError("timed out after 90s waiting for slurmd\nslurmd.log:\n  fatal: x")

    monkeypatch.setattr(LocalCluster, "load", classmethod(load))
    err = _fails(capsys, ["cluster", "env", "--dir", str(tmp_path)], "cluster",
                 "timed out after 90s")
    assert err.splitlines()[1:] == ["  slurmd.log:", "    fatal: x"]


class _Slurm:
    def __init__(self, exc):
        self.exc = exc

    def set_comment(self, job_id, text):
        raise self.exc

    def submit(self, path, args=()):
        raise self.exc


def test_resize_of_an_unknown_job_and_a_failing_slurm(capsys, monkeypatch):
    monkeypatch.setattr(common, "client", lambda args: _Slurm(UnknownJob(7)))
    _fails(capsys, ["resize", "7", "2"], "resize", "no job 7 in Slurm")
    failed = CommandError(["scontrol", "update"], 1, "slurm_update error: Access denied\n")
    monkeypatch.setattr(common, "client", lambda args: _Slurm(failed))
    _fails(capsys, ["resize", "7", "2"], "resize", "'scontrol update' failed", "Access denied")
    _fails(capsys, ["resize", "7", "0"], "resize")           # refused before Slurm is asked
    _usage(capsys, ["resize", "seven", "2"], "not a Slurm job id")


def test_sbatch_errors(capsys, monkeypatch, tmp_path):
    _fails(capsys, ["sbatch", "no-such-template", "--dry-run"], "sbatch", "no template")
    monkeypatch.setattr(common, "client", lambda args: _Slurm(
        CommandError(["sbatch", "--parsable"], 1, "sbatch: error: invalid partition\n")))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # where the script is written
    _fails(capsys, ["sbatch", "single-node", "--set", "program=x.py"], "sbatch",
           "invalid partition")
    assert list(tmp_path.iterdir()) == []      # a script not submitted is not left behind
    _usage(capsys, ["status", "--", "x"], "takes no arguments after '--'")


def test_agent_config_errors(tmp_path, capsys):
    _fails(capsys, ["agent", "--config", str(tmp_path / "none.json"), "--once"], "agent",
           "cannot read the agent's config", "No such file or directory")
    bad = tmp_path / "bad.json"
    for text, part in (("{", "bad agent config"), ('{"nodee": "n1"}', "unknown agent settings"),
                       ("[1]", "bad agent config"), ('{"policy": "static"}', "node"),
                       ('{"node": "n1"}', "missing setting 'policy'")):
        bad.write_text(text)
        _fails(capsys, ["agent", "--config", str(bad), "--once"], "agent", part)


def test_cgroups_errors(capsys, monkeypatch):
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.delenv("SLURM_NODENAME", raising=False)
    _fails(capsys, ["cgroups"], "cgroups", "which node?")
    from slurm_plugin.cgroups import LayoutUnknown

    def discover_layout(node, slurm_conf=None):
        raise LayoutUnknown(f"no Slurm cgroup folder for node {node}")

    monkeypatch.setattr("slurm_plugin.cgroups.discover_layout", discover_layout)
    _fails(capsys, ["cgroups", "--node", "zz"], "cgroups", "no Slurm cgroup folder")


def test_watcher_without_slurm_conf(tmp_path, capsys):
    _fails(capsys, ["watcher", "--once", "--feed-dir", str(tmp_path / "feed"), "--slurm-conf",
                    str(tmp_path / "none.conf")], "watcher", "no slurm.conf at")


def test_a_bug_is_not_hidden_as_a_runtime_error(monkeypatch):
    monkeypatch.setattr(common, "client", lambda args: _Slurm(ZeroDivisionError("bug")))
    with pytest.raises(ZeroDivisionError):
        main(["resize", "7", "2"])
    # A ValueError, or an OSError that names no path, is a bug too (they were one-line errors).
    monkeypatch.setattr(common, "client", lambda args: _Slurm(ValueError("bug")))
    with pytest.raises(ValueError):
        main(["resize", "7", "2"])
    monkeypatch.setattr(common, "client", lambda args: _Slurm(OSError(5, "EIO")))
    with pytest.raises(OSError):
        main(["resize", "7", "2"])


def test_a_path_the_world_refused_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(common, "client", lambda args: _Slurm(
        PermissionError(13, "Permission denied", "/etc/slurm/slurm.conf")))
    _fails(capsys, ["resize", "7", "2"], "resize", "/etc/slurm/slurm.conf: Permission denied")


def test_runtime_errors_exit_1_in_a_real_process(tmp_path):
    out = subprocess.run([sys.executable, "-m", "slurm_plugin.commands.main", "status", "--feed-dir",
                          str(tmp_path / "missing")], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("malleable status: no feed folder at"), out.stderr
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr


# --- --metrics-address -----------------------------------------------------------------------

def test_metrics_address_default_and_values():
    args = build_parser().parse_args(["agent", "--config", "a.json", "--metrics-port", "9100"])
    assert args.metrics_address == "127.0.0.1"               # nothing changes unless asked
    for given, parsed in (("0.0.0.0", "0.0.0.0"), ("10.1.2.3", "10.1.2.3"), ("::", "::"),
                          ("0:0::1", "::1")):
        args = build_parser().parse_args(["agent", "--config", "a.json",
                                          "--metrics-address", given])
        assert args.metrics_address == parsed


@pytest.mark.parametrize("bad", ["node1.example.org", "localhost", "10.1.2", "300.1.2.3", ""])
def test_metrics_address_must_be_an_ip_address(bad, capsys):
    _usage(capsys, ["agent", "--config", "a.json", "--metrics-address", bad],
           "argument --metrics-address", f"not an IP address: {bad!r}", "0.0.0.0")


def test_the_agent_gets_the_metrics_address_and_sets_up_its_log(tmp_path, monkeypatch, capsys):
    from slurm_plugin.daemon import agent as agent_mod
    from slurm_plugin.node.config import AgentConfig
    config = tmp_path / "agent.json"
    config.write_text(AgentConfig(node="n1", state_dir=tmp_path).to_json())
    seen = {}

    def run_agent(config, **kw):
        seen.update(kw, node=config.node)
        logging.getLogger("malleable.agent").debug("a debug line")
        logging.getLogger("malleable.agent").info("an info line")
        return 0

    monkeypatch.setattr(agent_mod, "run_agent", run_agent)
    assert main(["agent", "--config", str(config), "--node", "n7", "--metrics-port", "9100",
                 "--metrics-address", "0.0.0.0"]) == 0
    assert seen["metrics_addr"] == "0.0.0.0" and seen["metrics_port"] == 9100
    assert seen["node"] == "n7"
    err = capsys.readouterr().err
    assert "INFO agent[n7]: an info line" in err and "a debug line" not in err
    assert main(["agent", "--config", str(config), "--log-level", "debug"]) == 0
    assert "DEBUG agent[n1]: a debug line" in capsys.readouterr().err


# --- logging ---------------------------------------------------------------------------------

def test_setup_logging_names_the_component_filters_and_replaces_itself(capsys):
    log = logging.getLogger("malleable.watcher")
    setup_logging("watcher", "WARNING")
    log.info("quiet")
    log.warning("loud")
    setup_logging("watcher", "DEBUG")                          # again: one handler, new level
    log.debug("details")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "quiet" not in lines[0]
    assert lines[0].endswith(" WARNING watcher: loud")
    assert lines[1].endswith(" DEBUG watcher: details")
    assert sum(getattr(h, "_malleable", False) for h in logging.getLogger().handlers) == 1
    with pytest.raises(ValueError):
        setup_logging("watcher", "LOUD")


def test_a_daemon_prints_every_threads_stack_on_the_stacks_signal():
    """``dump_stacks_on_signal`` (the agent's and the watcher's): STACKS_SIGNAL makes a process
    whose threads are all waiting print each one's Python stack on stderr, and it runs on."""
    code = ("import sys, threading, time\n"
            "from slurm_plugin.logs import dump_stacks_on_signal\n"
            "dump_stacks_on_signal()\n"
            "def waiting_in_a_thread(): threading.Event().wait()\n"
            "threading.Thread(target=waiting_in_a_thread, daemon=True).start()\n"
            "print('ready', flush=True)\n"
            "def waiting_in_main(): time.sleep(5); print('ran on', flush=True)\n"
            "waiting_in_main()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        proc.send_signal(STACKS_SIGNAL)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and out.strip() == "ran on", err
    assert "waiting_in_a_thread" in err and "waiting_in_main" in err, err


@pytest.mark.parametrize("command", [["agent", "--config", "a.json"], ["watcher"],
                                     ["containers"]])
def test_long_running_commands_take_a_log_level(command, capsys):
    assert build_parser().parse_args(command).log_level == "INFO"
    assert build_parser().parse_args([*command, "--log-level", "error"]).log_level == "ERROR"
    _usage(capsys, [*command, "--log-level", "LOUD"], "--log-level")


def test_no_other_logging_set_up_is_left():
    """One set-up (slurm_plugin/logs.py) for the node side: no basicConfig anywhere else."""
    for path in (ROOT / "slurm_plugin").rglob("*.py"):
        text = path.read_text()
        assert "basicConfig" not in text, path
        if path.name != "logs.py":
            assert "StreamHandler" not in text, path


# --- the user runtime: resize lines by rank ------------------------------------------------------

@pytest.mark.parametrize("rank,level", [(0, logging.INFO), (1, logging.DEBUG),
                                        (5, logging.DEBUG)])
def test_resize_lines_are_info_on_rank_0_only(rank, level, caplog):
    from malleable_runtime.runtime import Runtime

    w = World({0, 1, 2, 3})
    rt = Runtime(*fake_tf_adapter(w.calls, 4), local_rank=0, local_size=1,
                 rank=rank, read_affinity=lambda: w.mask, cgroup=w, pin=w.pin)
    with caplog.at_level(logging.DEBUG, logger="malleable_runtime"):
        rt.set_threads(reason="init")
        rt.set_threads(intra=2, reason="test")
    resizes = [r for r in caplog.records if " resize intra " in r.getMessage()]
    assert resizes and all(r.levelno == level for r in resizes), resizes
    assert f"rank {rank} resize intra 4->2" in resizes[-1].getMessage()


def test_other_ranks_resize_lines_are_not_shown_by_default(capsys):
    """The runtime's own handler (logger at INFO) drops the DEBUG lines unless asked for."""
    from malleable_runtime.runtime import Runtime
    from malleable_runtime.session import setup_logging

    log = logging.getLogger("malleable_runtime")
    saved = (list(log.handlers), log.level, log.propagate)
    for h in saved[0]:
        log.removeHandler(h)
    try:
        setup_logging(True)
        for rank in (0, 1):
            w = World({0, 1, 2, 3})
            rt = Runtime(*fake_tf_adapter(w.calls, 4), local_rank=0,
                         local_size=1, rank=rank, read_affinity=lambda: w.mask, cgroup=w,
                         pin=w.pin)
            rt.set_threads(intra=2, reason="test")
        err = capsys.readouterr().err
        assert "rank 0 resize intra" in err and "rank 1 resize" not in err
    finally:
        for h in list(log.handlers):
            log.removeHandler(h)
        for h in saved[0]:
            log.addHandler(h)
        log.setLevel(saved[1])
        log.propagate = saved[2]


def test_the_watcher_waits_for_slurmctld_and_stops_on_sigterm(tmp_path):
    """Started before slurmctld (a service beside it, docker-slurm's controller), the watcher
    waits for it, saying so, instead of exiting; SIGTERM meanwhile stops it cleanly."""
    import signal
    import subprocess
    import time
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=29999\n"
                    "AuthType=auth/munge\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    err = tmp_path / "err"
    with open(err, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "slurm_plugin.commands.main", "watcher",
                                 "--feed-dir", str(tmp_path / "feed"), "--slurm-conf", str(conf)],
                                stderr=f, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while "does not answer yet" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "does not answer yet" in err.read_text(), err.read_text()
        assert proc.poll() is None                          # still waiting, not exited
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, err.read_text()
    finally:
        proc.kill()


def test_every_help_text_is_plain_text():
    """Help is read in a terminal: no reStructuredText quotes (issue 42)."""
    import argparse

    from slurm_plugin.commands.main import build_parser
    parser = build_parser()
    texts = [parser.format_help()]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    texts += [p.format_help() for p in sub.choices.values()]
    assert len(texts) > 10
    assert [t.splitlines()[0] for t in texts if "`" in t] == []
