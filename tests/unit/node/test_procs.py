"""Which process a pid is, from the kernel's uids (never what the process says of itself), and
signals sent through a pidfd opened before the check: real processes."""
import fcntl
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from slurm_plugin.node.executor import PlanExecutor
from slurm_plugin.node.procs import (agent_pid, flock_holder, is_agent, lock_holder,
                                            process_uid, signal_verified)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs processes as other users")
PY = next((p for p in ("/usr/bin/python3", "/bin/python3") if os.access(p, os.X_OK)),
          sys.executable)         # one every user can run
USER = 4242
# A process whose argv reads like the agent's: "agent" and "slurm_plugin" as arguments.
AGENT_ARGV = [PY, "-c", "import time; print('up', flush=True); time.sleep(60)", "agent",
              "slurm_plugin"]
# The same, made non-dumpable: /proc/<pid> is then root's, whoever runs it.
NON_DUMPABLE = [PY, "-c", "import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); "
                "print('set', flush=True); time.sleep(60)", "agent", "slurm_plugin"]


def as_user(uid, gid=None):
    def drop():
        os.setgroups([])
        os.setresgid(gid or uid, gid or uid, gid or uid)
        os.setresuid(uid, uid, uid)
    return drop


@pytest.fixture
def procs():
    started = []

    def start(argv, **kw):
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, cwd="/", **kw)
        started.append(p)
        if argv[0] == PY:
            assert p.stdout.readline()      # running its own program (exec done)
        return p
    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_the_uid_is_every_uid_of_the_process(procs):
    assert process_uid(os.getpid()) == os.geteuid()
    assert process_uid(0) is None and process_uid(-1) is None and process_uid(True) is None
    assert process_uid(2 ** 22 + 12345) is None            # above pid_max: no such process


@needs_root
def test_a_process_whose_uids_differ_is_nobodys(procs):
    user = procs(AGENT_ARGV, preexec_fn=as_user(USER))
    mixed = procs(AGENT_ARGV, preexec_fn=lambda: os.setresuid(USER, 0, 0))
    assert process_uid(user.pid) == USER
    assert process_uid(mixed.pid) is None                  # real uid a user's, effective root
    assert not is_agent(mixed.pid)


@needs_root
def test_a_non_dumpable_user_process_with_the_agents_argv_is_not_the_agent(procs, tmp_path):
    fake = procs(NON_DUMPABLE, preexec_fn=as_user(USER))
    # /proc/<pid>'s entries are root's now (and, on some kernels, /proc/<pid> itself):
    # the owner a stat shows is no identity.
    assert os.stat(f"/proc/{fake.pid}/status").st_uid == 0
    assert process_uid(fake.pid) == USER
    assert not is_agent(fake.pid)
    pid_file = tmp_path / "agent-n1.pid"
    pid_file.write_text(str(fake.pid))
    assert agent_pid(pid_file) is None


@needs_root
def test_the_agent_is_a_root_process_named_in_its_pid_file(procs, tmp_path):
    agent = procs(AGENT_ARGV)
    pid_file = tmp_path / "agent-n1.pid"
    pid_file.write_text(str(agent.pid))
    assert is_agent(agent.pid) and agent_pid(pid_file) == agent.pid
    assert not is_agent(os.getpid())                      # root, but not the agent's argv
    pid_file.write_text("1" * 100)                         # over the bound: not read
    assert agent_pid(pid_file) is None
    pid_file.unlink()
    (tmp_path / "elsewhere").write_text(str(agent.pid))
    pid_file.symlink_to(tmp_path / "elsewhere")
    assert agent_pid(pid_file) is None                     # a link is not followed


def test_the_lock_holder_is_matched_by_device_and_inode(tmp_path):
    lock = tmp_path / "agent-n1.lock"
    with open(lock, "w") as f:
        assert lock_holder(lock) is None
        fcntl.flock(f, fcntl.LOCK_EX)
        assert lock_holder(lock) == os.getpid()
    st = os.stat(lock)
    here = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    other_dev = f"{os.major(st.st_dev) + 1:02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    assert flock_holder(f"1: FLOCK  ADVISORY  WRITE 777 {here} 0 EOF\n", st.st_dev,
                        st.st_ino) == 777
    # The same inode number on another file system: not our lock.
    assert flock_holder(f"1: FLOCK  ADVISORY  WRITE 777 {other_dev} 0 EOF\n", st.st_dev,
                        st.st_ino) is None
    assert flock_holder(f"1: -> FLOCK  ADVISORY  WRITE 778 {here} 0 EOF\n"      # a waiter
                        f"2: POSIX  ADVISORY  WRITE 779 {here} 0 EOF\n", st.st_dev,
                        st.st_ino) is None


def test_a_signal_goes_only_to_the_process_checked(procs):
    p = procs(["sleep", "60"])
    seen = []
    assert not signal_verified(p.pid, signal.SIGTERM, lambda pid: seen.append(pid) or False)
    assert seen == [p.pid] and p.poll() is None             # check failed: nothing sent
    assert signal_verified(p.pid, signal.SIGTERM, lambda pid: True)
    assert p.wait(10) == -signal.SIGTERM


def test_a_process_gone_between_the_check_and_the_signal_is_not_confused_with_the_pids_next_owner(
        procs):
    p = procs(["sleep", "60"])

    def check_then_it_exits(pid):
        p.kill()
        p.wait()      # reaped: the pid is free for anyone now; the pidfd still names the old one
        return True
    assert not signal_verified(p.pid, signal.SIGTERM, check_then_it_exits)


def test_no_signal_without_a_process(procs):
    called = []
    for pid in (0, 1, -1, -os.getpid(), True, 2 ** 22 + 12345):
        assert not signal_verified(pid, signal.SIGTERM, lambda pid: called.append(pid) or True)
    assert called == []


def test_the_executor_signals_ranks_through_a_checked_pidfd(procs):
    rt_signal = signal.SIGRTMIN + 3                      # what the rank's record names
    # Its default action, which ends the process: this test process may ignore it (importing
    # malleable_tf does), and a child inherits that.
    default = lambda: signal.signal(rt_signal, signal.SIG_DFL)   # noqa: E731
    told, other = procs(["sleep", "60"], preexec_fn=default), procs(["sleep", "60"])
    checked = []

    def check_pid(pid, job_id, cgroups, uid):
        checked.append((pid, job_id, uid))
        return pid == told.pid
    actuator = SimpleNamespace(layout="layout")
    ex = PlanExecutor("n1", None, actuator, check_pid=check_pid)       # the real signaller
    ranks = (SimpleNamespace(pid=told.pid, reload_signal=rt_signal),
             SimpleNamespace(pid=other.pid, reload_signal=signal.SIGUSR1))
    ex._signal(SimpleNamespace(job_id=5, uid=1000), ranks)
    assert told.wait(10) == -rt_signal
    assert other.poll() is None                  # not the job's any more: not signalled
    assert checked == [(told.pid, 5, 1000), (other.pid, 5, 1000)]
