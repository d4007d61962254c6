"""The node's hooks: the Epilog marks the job ended whatever its folder holds, the hung-agent
kill reaches only a verified agent holding the lock, the step start trusts only root's uids,
and the rendered Prolog and Epilog run Python isolated."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_plugin.hooks import job_hooks as hooks
from slurm_plugin.node.config import AgentConfig
from slurm_plugin.hooks.install import prepare_node_folders, render_hook
from slurm_plugin.hooks.job_folder import LEFTOVER_PREFIX, make_job_folder
from slurm_plugin.node.ledger import LedgerFile
from slurm_plugin.node.procs import is_agent

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs processes as other users")
PY = next((p for p in ("/usr/bin/python3", "/bin/python3") if os.access(p, os.X_OK)),
          sys.executable)
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def config(tmp_path, monkeypatch):
    c = AgentConfig.under(tmp_path, node="n1")
    prepare_node_folders(c)
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_JOB_UID", str(os.geteuid()))
    return c


def ended(config):
    return LedgerFile(config.state_dir, config.node).load().ended


def test_the_epilog_marks_the_job_ended_even_when_the_removal_fails(config, monkeypatch):
    def boom(*a, **kw):
        raise RecursionError("maximum recursion depth exceeded")
    monkeypatch.setattr(hooks, "remove_job_folder", boom)
    assert hooks.epilog(config) == 0
    assert 41 in ended(config)
    log = (config.state_dir / "hooks-n1.log").read_text()
    assert "epilog job 41: status folder: RecursionError" in log


def test_the_epilog_removes_a_folder_1200_deep_and_marks_the_job_ended(config):
    folder = make_job_folder(config.layout, 41, os.geteuid(), os.getegid())
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1200):                 # shutil.rmtree recursed: RecursionError, never ended
        os.mkdir("d", dir_fd=fd)
        nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)
    assert hooks.epilog(config) == 0
    assert not folder.exists() and 41 in ended(config)


def test_an_epilog_over_its_budget_leaves_the_rest_to_the_next_one(config, monkeypatch):
    folder = make_job_folder(config.layout, 41, os.geteuid(), os.getegid())
    for i in range(300):
        (folder / f"rank_{i}.json").write_text("{}")
    monkeypatch.setattr(hooks, "REMOVE_BUDGET", 100)
    assert hooks.epilog(config) == 0
    assert 41 in ended(config) and not folder.exists()
    (aside,) = os.listdir(config.layout.jobs_dir)
    assert aside.startswith(LEFTOVER_PREFIX)
    assert "budget" in (config.state_dir / "hooks-n1.log").read_text()
    monkeypatch.setattr(hooks, "REMOVE_BUDGET", 100_000)
    monkeypatch.setenv("SLURM_JOB_ID", "42")          # the next job's Epilog finishes it
    assert hooks.epilog(config) == 0
    assert os.listdir(config.layout.jobs_dir) == [] and 42 in ended(config)


class Busy:
    """A reconciler whose first cycle found the node's lock held."""

    def __init__(self):
        self.cycles = 0

    def cycle(self, **kw):
        self.cycles += 1
        return SimpleNamespace(lock_busy=self.cycles == 1)


def holder(config, argv_tail):
    """A root process holding the node's lock, with ``argv_tail`` as its arguments."""
    code = ("import fcntl, sys, time; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('locked', flush=True); time.sleep(60)")
    config.lock_file.touch(mode=0o600)
    p = subprocess.Popen([PY, "-c", code, str(config.lock_file), *argv_tail],
                         stdout=subprocess.PIPE, cwd="/")
    assert p.stdout.readline() == b"locked\n"
    config.pid_file.write_text(str(p.pid))
    return p


@needs_root
def test_a_hung_agent_holding_the_lock_is_killed_and_the_cycle_runs_again(config):
    p = holder(config, ["agent", "slurm_plugin"])
    try:
        rec = Busy()
        hooks._hook_cycle(config, rec, "prolog job 41")
        assert p.wait(10) == -signal.SIGKILL and rec.cycles == 2
        assert "killed the hung agent" in (config.state_dir / "hooks-n1.log").read_text()
    finally:
        p.kill()
        p.wait()


@needs_root
def test_a_process_holding_the_lock_that_is_not_the_agent_is_not_killed(config):
    p = holder(config, ["not-the-agent"])             # the pid file names it all the same
    agent = subprocess.Popen([PY, "-c", "import time; print(1, flush=True); time.sleep(60)",
                              "agent", "slurm_plugin"], stdout=subprocess.PIPE, cwd="/")
    agent.stdout.readline()
    assert is_agent(agent.pid) and not is_agent(p.pid)
    try:
        rec = Busy()
        hooks._hook_cycle(config, rec, "prolog job 41")
        config.pid_file.write_text(str(agent.pid))     # an agent, but not the lock's holder
        hooks._hook_cycle(config, rec, "prolog job 41")
        assert p.poll() is None and agent.poll() is None and rec.cycles == 2
    finally:
        for q in (p, agent):
            q.kill()
            q.wait()


@needs_root
def test_step_start_trusts_only_a_process_whose_every_uid_is_roots(config):
    code = "import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); print(1, flush=True); " \
           "time.sleep(60)"

    def drop():
        os.setgroups([])
        os.setresgid(4242, 4242, 4242)
        os.setresuid(4242, 4242, 4242)
    p = subprocess.Popen([PY, "-c", code, "slurmstepd"], stdout=subprocess.PIPE, cwd="/",
                         preexec_fn=drop)
    try:
        p.stdout.readline()              # non-dumpable: its /proc entries are root's
        with pytest.raises(ValueError, match="not a slurmstepd of root"):
            hooks.step_start(config, 41, "step_0", p.pid)
    finally:
        p.kill()
        p.wait()


def test_the_prolog_and_epilog_run_python_isolated(tmp_path):
    for hook in ("prolog.sh", "epilog.sh"):
        text = render_hook(hook, python="/opt/venv/bin/python", config=tmp_path / "agent.json",
                           state_dir=tmp_path / "state")
        assert f"exec /opt/venv/bin/python -I -m slurm_plugin.hooks " \
               f"{hook[:-3]} --config {tmp_path / 'agent.json'}" in text
    assert '"-I", "-m", "slurm_plugin.hooks"' in \
        (REPO / "slurm_plugin" / "hooks" / "spank" / "malleable_spank.c").read_text()
    # Installed in this Python (not found from the cwd or PYTHONPATH): -I still finds it.
    # The path an earlier version rendered into Prologs runs the same hooks (until the site's
    # `install-slurm-hooks` renders them again).
    for module in ("slurm_plugin.hooks", "slurm_plugin.coscheduler.hooks"):
        out = subprocess.run([sys.executable, "-I", "-m", module, "--help"], cwd="/",
                             env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0 and "prolog,epilog,step-start" in out.stdout, (module, out)


def test_without_its_tmpfs_a_jobs_records_folder_stays_roots(config, monkeypatch, tmp_path,
                                                             capsys):
    """Issue 40: when the job's tmpfs cannot be mounted (here: no mount program on PATH, a
    real failure of the real runner), its folder is root's and 0700, so its user cannot fill
    the node's /run through it; the job runs rigid, the Prolog does not fail, and the hooks
    log and slurmd's log say why. With the tmpfs, the folder's root is the job user's."""
    user = 4242
    empty = tmp_path / "no-programs"
    empty.mkdir()
    with monkeypatch.context() as m:
        m.setenv("PATH", str(empty))
        hooks._prepare_job_folder(config, 41, user, user)
    folder = config.layout.job_dir(41)
    st = os.lstat(folder)
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
    assert "no records folder of its own" in (config.state_dir / "hooks-n1.log").read_text()
    assert "not lent cores" in capsys.readouterr().err
    from slurm_plugin.hooks.job_folder import remove_job_folder
    assert remove_job_folder(config.layout, 41, user).complete and not folder.exists()
    hooks._prepare_job_folder(config, 42, user, user)       # with mount(8): its own tmpfs
    try:
        assert os.lstat(config.layout.job_dir(42)).st_uid == user
    finally:
        subprocess.run(["umount", "--lazy", str(config.layout.job_dir(42))], check=True)
    assert remove_job_folder(config.layout, 42, user).complete     # root's again, unmounted


def test_on_a_quiet_node_the_prolog_of_a_job_without_a_sign_of_malleability_skips_python(
        tmp_path):
    """Issue 40, jobs that did not ask pay nothing: the rendered Prolog, run by sh with the
    environment slurmd gives it. Its interpreter here is /bin/false, so exit 0 means it was not
    started. On a quiet node a job without a sign skips it; the SPANK option (but off), a
    comment naming malleability (any case, or misspelt), a node that is not quiet, and a
    missing node name each start it."""
    state = tmp_path / "state"
    state.mkdir()
    prolog = tmp_path / "prolog.sh"
    prolog.write_text(render_hook("prolog.sh", python="/bin/false", config=tmp_path / "a.json",
                                  state_dir=state))

    def run(**env: str) -> int:
        base = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "5"}
        return subprocess.run(["sh", str(prolog)], env={**base, **env}).returncode
    assert run() == 1                                      # not quiet: Python runs
    (state / "quiet-n1").write_text("")
    assert run() == 0
    assert run(SPANK_MALLEABLE="off", SLURM_JOB_COMMENT="nightly build") == 0
    assert run(SPANK_MALLEABLE="2:8") == 1
    for comment in ("malleable:min=1", "MALLEABLE:min=1", "maleable:max=2", "x Malleable"):
        assert run(SLURM_JOB_COMMENT=comment) == 1, comment
    assert run(SLURMD_NODENAME="") == 1
    assert run(SLURMD_NODENAME="n2") == 1                  # another node's file: not quiet
    started = time.monotonic()
    for _ in range(20):
        run()
    print(f"\nfast path: {(time.monotonic() - started) / 20 * 1000:.1f} ms per Prolog (sh)")
