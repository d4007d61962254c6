"""The SPANK plugin's step start, decided in C, run outside Slurm: ``spank_host.c`` loads the
built plugin as slurmstepd does and calls its ``slurm_spank_init`` for one step, with the
plugstack.conf arguments a test gives. The hook it may start is a shell script standing in for
Python (``python=``), so what it inherits can be seen."""
from __future__ import annotations

import os
import resource
import signal
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from slurm_plugin.hooks.spank import build

HOST_SOURCE = Path(__file__).with_name("spank_host.c")
JOB, STEP = 41, 0


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("spank")
    plugin = build(d)
    exe = d / "spank_host"
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-Werror", "-rdynamic",
                    str(HOST_SOURCE), "-o", str(exe), "-ldl"], check=True)
    return exe, plugin


@pytest.fixture
def state(tmp_path) -> Path:
    s = tmp_path / "state"
    for d in (s, s / "gate-n1", s / "fences-n1"):
        d.mkdir(mode=0o755)
        d.chmod(0o755)
    return s


def start(host, *args: str, timeout: float = 15, **kw) -> subprocess.CompletedProcess:
    exe, plugin = host
    return subprocess.run([str(exe), str(plugin), str(JOB), str(STEP), *args],
                          env={"SLURMD_NODENAME": "n1", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=timeout, **kw)


def hook_script(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "fake-python"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return p


def test_a_gated_job_starts_with_a_fence_and_no_process(host, state, tmp_path):
    (state / "gate-n1" / str(JOB)).write_text("")
    got = start(host, "python=/bin/false", "config=/nonexistent", f"state={state}")
    assert got.returncode == 0, got.stderr
    assert (state / "fences-n1" / f"{JOB}.step_{STEP}").read_text().split()[0].isdigit()


def test_a_state_folder_others_may_write_is_not_believed(host, state, tmp_path):
    """Issue 40, finding 8: ``state=`` was not checked. Anyone who can write it can plant a
    gate (the step would start on cores lent out) or a socket that answers "ok"."""
    (state / "gate-n1" / str(JOB)).write_text("")
    state.chmod(0o777)
    got = start(host, "python=/bin/false", "config=/nonexistent", f"state={state}")
    assert got.returncode == 1 and "hook exit 1" in got.stderr, got.stderr
    assert not (state / "fences-n1" / f"{JOB}.step_{STEP}").exists()


def _slurmstepd_like() -> None:
    """What slurmstepd may hand its plugins: a descriptor as high as its limit allows (above
    65,536 where the limit is higher; this machine's hard limit is 20,000 and root here may
    not raise it), signals ignored."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    fd = os.open("/dev/null", os.O_RDONLY)
    os.dup2(fd, hard - 1)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_the_hook_inherits_no_descriptor_and_no_ignored_signal(host, tmp_path):
    """Issue 40, finding 8: descriptors were closed only below 65,536 (now every one, with
    close_range), and a signal slurmstepd ignores stayed ignored in the hook (SIGTERM could
    not stop it)."""
    hook = hook_script(tmp_path, "ls /proc/self/fd | tr '\\n' ' ' >&2\n"
                                 "grep SigIgn /proc/self/status >&2\nexit 1\n")
    got = start(host, f"python={hook}", "config=/nonexistent", preexec_fn=_slurmstepd_like,
                close_fds=False)
    assert got.returncode == 1 and "hook exit 1" in got.stderr, got.stderr
    fds = got.stderr.split("hook exit 1): ", 1)[1].split("SigIgn")[0].split()
    assert sorted(int(f) for f in fds) == [0, 1, 2, 3], got.stderr     # 3: ls's own folder
    ignored = int(got.stderr.split("SigIgn:")[1].split()[0], 16)
    assert not ignored & (1 << (signal.SIGTERM - 1) | 1 << (signal.SIGINT - 1)), got.stderr


def test_an_agent_socket_that_never_accepts_does_not_hold_the_step(host, state, tmp_path):
    """Issue 40, finding 8: connect() had no timeout: a listener whose queue is full held
    the step's start for as long as it liked. Now the plugin goes on to the hook at once."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(state / "agent-n1.sock"))
    listener.listen(0)
    fillers = []
    while True:                          # fill its queue: the next connect would wait
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(str(state / "agent-n1.sock"))
        except BlockingIOError:
            s.close()
            break
        fillers.append(s)
    try:
        got = start(host, "python=/bin/false", "config=/nonexistent", f"state={state}",
                    timeout=10)
    finally:
        for s in fillers + [listener]:
            s.close()
    assert got.returncode == 1 and "hook exit 1" in got.stderr, got.stderr
    assert stat.S_ISSOCK(os.stat(state / "agent-n1.sock").st_mode)


def test_a_timeout_that_is_not_a_number_of_seconds_means_the_default(host, tmp_path):
    """Issue 40, finding 8: ``timeout=nan`` made every comparison with the deadline false, so
    a hung hook held the step's start for ever; nan, inf, negative and over-long values now
    mean the default 20 s (MAX_TIMEOUT_S is 600). A hook that would sleep 60 s is killed at
    20 s for each (the three run side by side)."""
    hook = hook_script(tmp_path, "exec sleep 60\n")
    runs = {value: subprocess.Popen(
        [str(host[0]), str(host[1]), str(JOB), str(STEP), f"python={hook}",
         "config=/nonexistent", f"timeout={value}"],
        env={"SLURMD_NODENAME": "n1", "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for value in ("nan", "inf", "-5", "1e9")}
    for value, run in runs.items():
        _, err = run.communicate(timeout=45)
        assert run.returncode == 1 and "no answer in 20 s" in err, (value, err)


def test_on_a_quiet_node_every_step_starts_with_a_fence_and_no_process(host, state, tmp_path):
    """A job whose Prolog skipped Python on a quiet node has no gate of the agent's yet: the
    node's quiet file (root's) stands for it; one that is not root's does not (the hook then
    decides: here /bin/false, exit 1)."""
    (state / "quiet-n1").write_text("")
    got = start(host, "python=/bin/false", "config=/nonexistent", f"state={state}")
    assert got.returncode == 0, got.stderr
    assert (state / "fences-n1" / f"{JOB}.step_{STEP}").read_text().split()[0].isdigit()
    (state / "fences-n1" / f"{JOB}.step_{STEP}").unlink()
    os.chown(state / "quiet-n1", 4242, 4242)
    got = start(host, "python=/bin/false", "config=/nonexistent", f"state={state}")
    assert got.returncode == 1 and not (state / "fences-n1" / f"{JOB}.step_{STEP}").exists()
