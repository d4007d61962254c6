"""Hostile job users and faults, on the real local cluster with real unprivileged users.

Two local users (no home) run malleable TensorFlow jobs from the site environment (Debian's
Python, world-readable). After each attack or fault, the invariant checker looks at the real
node: no core in two jobs, every job within its bounds, no rank with more threads than its
cores, the agent alive, files outside the job's folder unchanged.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from malleable_protocol import RankStatus, parse_cpu_list
from slurm_plugin.cluster import daemons
from slurm_plugin.slurm import JobState, UnknownJob

from .helpers import agent_events, cgroup_cpus, rank_statuses, wait_for
from .invariants import fingerprint, violations

pytestmark = pytest.mark.cluster
NODE, OTHER = "an1", "an2"
SITE = Path(os.environ.get("MALLEABLE_SITE_VENV", "/opt/malleable/venv"))
PROGRAM = Path(__file__).parent.parent / "programs" / "hvd_train.py"
ALICE, BOB = "mtalice", "mtbob"


def run_as(user: str, argv: list[str], env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *argv], env=env, capture_output=True,
                          text=True, timeout=kw.pop("timeout", 60), **kw)


@pytest.fixture(scope="module")
def users():
    for u in (ALICE, BOB):
        subprocess.run(["useradd", "-M", "-d", "/nonexistent", "-s", "/bin/sh", u],
                       capture_output=True)
    yield ALICE, BOB
    for u in (ALICE, BOB):
        subprocess.run(["pkill", "-KILL", "-u", u], capture_output=True)
        for _ in range(100):   # userdel refuses while a process of the user lives
            if subprocess.run(["userdel", u], capture_output=True).returncode in (0, 6):
                break
            time.sleep(0.2)


@pytest.fixture(scope="module")
def work(users):
    d = Path(tempfile.mkdtemp(prefix="malleable-hostile-", dir="/tmp"))
    d.chmod(0o777)
    shutil.copy(PROGRAM, d / "hvd_train.py")
    (d / "hvd_train.py").chmod(0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def submit_as(cluster, user: str, work: Path, name: str, body: str, args=()) -> int:
    script = work / f"{name}.sh"
    script.write_text("#!/bin/bash\n" + body)
    script.chmod(0o755)
    out = run_as(user, ["sbatch", "--parsable", f"--chdir={work}", *args, str(script)],
                 {**os.environ, **cluster.env()})
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def tf_job(cluster, user: str, work: Path, name: str, node: str = NODE) -> int:
    """A malleable Horovod + Keras job of ``user``, from the site environment."""
    return submit_as(cluster, user, work, name, (
        "export TF_CPP_MIN_LOG_LEVEL=2\n"
        f"exec {SITE}/bin/malleable-srun {SITE}/bin/python {work}/hvd_train.py "
        f"{work}/stop-$SLURM_JOB_ID 1000000\n"),
        ["-N1", "-n1", f"-w{node}", "--comment=malleable:min=1,max=node",
         f"--output={work}/{name}-%j.out", "--time=20"])


def resize_as(cluster, user: str, job: int, text: str) -> subprocess.CompletedProcess:
    return run_as(user, ["scontrol", "update", f"JobId={job}", f"Comment=malleable:{text}"],
                  {**os.environ, **cluster.env()})


def cores(cluster, job: int, uid: int, node: str = NODE) -> frozenset[int]:
    return cgroup_cpus(cluster, node, job, uid=uid) or frozenset()


def uid_of(user: str) -> int:
    import pwd
    return pwd.getpwnam(user).pw_uid


@pytest.fixture(scope="module")
def alice_job(agent_cluster, work):
    """Alice's malleable TensorFlow job on NODE, training for the whole module."""
    c = agent_cluster
    a = tf_job(c, ALICE, work, "alice")
    uid = uid_of(ALICE)
    every = frozenset(range(os.cpu_count()))
    wait_for(lambda: (st := rank_statuses(c.run_layout.job_dir(a))) and
             all(s["intra_active"] == len(every) for s in st.values()) and cores(c, a, uid) == every,
             timeout=240, what="alice's job training on every core",
             show=lambda: (cores(c, a, uid), rank_statuses(c.run_layout.job_dir(a)),
                           sorted(work.glob("alice-*.out"))[:1] and
                           sorted(work.glob("alice-*.out"))[0].read_text()[-2000:]))
    yield a, uid
    (work / f"stop-{a}").touch()
    time.sleep(1)
    c.client().cancel(a)
    wait_for(lambda: not c.client().job(a).state.holds_cores, timeout=60, what="alice's job end")


def rank(cluster, job: int) -> dict:
    return next(iter(rank_statuses(cluster.run_layout.job_dir(job)).values()), {})


def settle(cluster, node: str = NODE, timeout: float = 15.0) -> None:
    """Threads follow cores within milliseconds; give them a moment, then nothing may be off."""
    wait_for(lambda: not violations(cluster, node), timeout=timeout, what="invariants",
             show=lambda: violations(cluster, node))


# Drain reasons Slurm gives for its own timeouts (slurmctld stopped for 60 s in
# test_slurmctld_stopped_for_60s: slurmd's messages to it time out), not for a hook's failure.
SLURMS_OWN_DRAINS = ("not responding", "batch job complete failure")


def slurm_node(cluster, name: str):
    """The node as Slurm reports it now."""
    return next(n for n in cluster.client().nodes() if n.name == name)


def drained(cluster, name: str) -> bool:
    """Slurm drains the node (22.05: a "drain..." state; 24.11: a DRAIN flag)."""
    node = slurm_node(cluster, name)
    return "DRAIN" in node.state_flags or node.state.startswith("drain")


def node_usable(cluster, node: str) -> None:
    """The node takes jobs: a drain Slurm made for its own timeouts is resumed (and printed);
    a drain for any other reason (a Prolog or Epilog failure) fails the test, with its reason."""
    env = {**os.environ, **cluster.env()}
    reason = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%E"], env=env,
                            capture_output=True, text=True).stdout.strip()
    if not drained(cluster, node):
        return
    if not reason.lower().startswith(SLURMS_OWN_DRAINS):
        # Why, from the node's slurmd (one CI run saw "Kill task failed" here: a step whose
        # processes outlived SIGKILL by UnkillableStepTimeout): its last errors.
        log = cluster.paths.log / f"slurmd-{node}.log"
        errors = [line for line in (log.read_text(errors="replace").splitlines()
                                    if log.exists() else [])
                  if "error" in line.lower() or "TERMINATED" in line][-30:]
        raise AssertionError(f"{node} drained: {reason!r}; slurmd's last errors:\n"
                             + "\n".join(errors))
    print(f"\n{node} was drained by Slurm ({reason!r}): resumed")
    subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=env,
                   check=True, capture_output=True)


def test_links_fifos_junk_and_foreign_writes_change_nothing(agent_cluster, alice_job, work):
    c, (a, uid) = agent_cluster, alice_job
    before = fingerprint()
    folder = c.run_layout.job_dir(a)
    plant = f"""
import json, os, errno
d = {str(folder)!r}
out = {{}}
os.symlink("/etc/shadow", d + "/rank_7.json")
os.symlink("/etc/passwd", d + "/.target-{NODE}.json.tmp")
os.mkfifo(d + "/rank_8.json")
os.mkdir(d + "/rank_9.json")
open(d + "/rank_10.json", "w").write('{{"pid":' * 50000)
open(d + "/rank_11.json", "wb").write(b"x" * (1 << 20))
junk = 0
for i in range(20000):       # the folder's own tmpfs stops it at its inode limit (ENOSPC)
    try:
        open(d + f"/junk_{{i}}", "w").close()
        junk += 1
    except OSError:
        break
for i in range(16):          # room again for the ranks' own records (a full folder is his)
    os.unlink(d + f"/junk_{{i}}")
def attempt(name, f):
    try:
        f(); out[name] = "done"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
attempt("mkdir next job folder", lambda: os.mkdir({str(c.run_layout.job_dir(a + 1))!r}))
attempt("write a target", lambda: open({str(c.run_layout.target_file(a + 1, NODE))!r}, "w"))
attempt("link in targets", lambda: os.symlink("/etc/shadow",
        {str(c.run_layout.targets_dir / "x.json")!r}))
attempt("replace own target", lambda: os.unlink({str(c.run_layout.target_file(a, NODE))!r}))
print(json.dumps(out))
print(junk)
"""
    got = run_as(ALICE, ["/usr/bin/python3", "-c", plant], os.environ)
    assert got.returncode == 0, got.stderr
    result, junk = got.stdout.splitlines()
    assert 1000 < int(junk) < 20000          # its folder's inode limit, 2,048 in all
    assert json.loads(result) == {"mkdir next job folder": "EACCES",
                                      "write a target": "EACCES", "link in targets": "EACCES",
                                      "replace own target": "EACCES"}
    # The owner resizes; the agent reads the hostile folder every cycle and must go on.
    for k, want in (("cpus=1", 1), ("max=node", os.cpu_count())):
        assert resize_as(c, ALICE, a, k).returncode == 0
        wait_for(lambda: len(cores(c, a, uid)) == want and rank(c, a).get("intra_active") == want,
                 timeout=15, what=f"alice at {want}", show=lambda: (cores(c, a, uid), rank(c, a)))
    # Bob's job arrives on the node: the Prolog takes alice's lent core back first.
    b = submit_as(c, BOB, work, "bob", "cat /proc/self/cpuset; grep Cpus_allowed_list "
                  "/proc/self/status\nsleep 3\n",
                  ["-N1", "-n1", f"-w{NODE}", f"--output={work}/bob-%j.out"])
    out = work / f"bob-{b}.out"
    wait_for(lambda: out.exists() and "Cpus_allowed_list" in out.read_text(), timeout=30,
             what="bob's job started")
    b_cpus = parse_cpu_list(out.read_text().split()[-1])
    assert not b_cpus & cores(c, a, uid), (b_cpus, cores(c, a, uid))
    settle(c)
    assert fingerprint() == before
    wait_for(lambda: not c.client().job(b).state.holds_cores, timeout=30, what="bob done")


def test_fake_records_and_stale_pid_files_never_signal_another_users_process(
        agent_cluster, alice_job, work):
    c, (a, _uid) = agent_cluster, alice_job
    victim = subprocess.Popen(["runuser", "-u", BOB, "--", "sleep", "600"])
    time.sleep(0.5)
    pid = int(subprocess.run(["pgrep", "-u", BOB, "-x", "sleep"], capture_output=True,
                             text=True).stdout.split()[0])
    try:
        fake = RankStatus(pid=pid, rank=5, local_rank=0, local_size=1, intra_active=2,
                          intra_pool=2, inter_active=2, inter_pool=2, node=NODE).encode()
        path = c.run_layout.job_dir(a) / "rank_5.json"
        got = run_as(ALICE, ["/usr/bin/python3", "-c",
                             f"open({str(path)!r}, 'wb').write({fake!r})"], os.environ)
        assert got.returncode == 0, got.stderr
        for k in ("cpus=1", "max=node"):      # shrinks signal the job's ranks
            assert resize_as(c, ALICE, a, k).returncode == 0
            time.sleep(2)
        assert Path(f"/proc/{pid}").exists(), "bob's process was signalled"
        # The agent dies by kill -9; its pid file now names bob's process (a reused pid).
        agent = next(r for r in c.records() if r.name == f"agent {NODE}")
        os.kill(agent.pid, signal.SIGKILL)
        daemons.reap_children()
        c.agent_config(NODE).pid_file.write_text(str(pid))
        env = {**os.environ, **c.env(), "SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "990101",
               "SLURM_JOB_UID": str(uid_of(BOB)), "SLURM_JOB_GID": str(uid_of(BOB))}
        assert subprocess.run([str(c.hooks_dir / "epilog.sh")], env=env,
                              capture_output=True).returncode == 0
        time.sleep(0.5)
        assert Path(f"/proc/{pid}").exists(), "the Epilog signalled a stale pid"
    finally:
        c.restart_agent(NODE)
        victim.kill()
        subprocess.run(["pkill", "-KILL", "-u", BOB, "-x", "sleep"], capture_output=True)
    path.unlink(missing_ok=True)
    settle(c)


def agent_stopping_at_write(c, write: int) -> list[str]:
    """The agent's command with a fault hook: it stops (SIGSTOP) before its ``write``-th cpuset
    write, the node's lock held (tests/programs/slurm_plugin_agent_stopping_at_write.py)."""
    return [sys.executable, str(Path(__file__).parent.parent / "programs" /
                                "slurm_plugin_agent_stopping_at_write.py"), "agent", str(write),
            *c.agent_args(NODE)]


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("T")
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("direction", ["shrink", "grow"])
def test_kill_9_at_each_cgroup_write_then_a_new_agent_converges(agent_cluster, alice_job,
                                                                 direction):
    c, (a, uid) = agent_cluster, alice_job
    every = os.cpu_count()
    start, request, want = (("max=node", "cpus=1", 1) if direction == "shrink"
                            else ("cpus=1", "max=node", every))
    points = []
    for k in range(1, 8):
        assert resize_as(c, ALICE, a, start).returncode == 0
        wait_for(lambda: len(cores(c, a, uid)) == (every + 1 - want), timeout=15,
                 what="the starting size")
        rec = c.restart_agent(NODE, argv=agent_stopping_at_write(c, k))
        time.sleep(1.0)          # its first cycles: nothing to write
        assert resize_as(c, ALICE, a, request).returncode == 0
        try:
            wait_for(lambda: _stopped(rec.pid), timeout=8, what=f"agent stopped at write {k}")
        except AssertionError:
            points.append((k, "sequence shorter"))
            break                 # fewer than k writes: every point was covered
        os.kill(rec.pid, signal.SIGKILL)
        daemons.reap_children()
        # Right after the kill, mid-sequence: still no core in two jobs.
        assert not [v for v in violations(c, NODE, threads=False)
                    if "agent" not in v], violations(c, NODE, threads=False)
        c.restart_agent(NODE)
        wait_for(lambda: len(cores(c, a, uid)) == want, timeout=15, what="converged")
        settle(c)
        points.append((k, "killed, converged"))
    assert points[0] == (1, "killed, converged") and points[-1][1] == "sequence shorter"
    print(f"\n{direction}: {points}")


def test_prolog_with_a_hung_agent_holding_the_lock(agent_cluster, alice_job, work):
    c, (a, uid) = agent_cluster, alice_job
    assert resize_as(c, ALICE, a, "max=node").returncode == 0
    wait_for(lambda: len(cores(c, a, uid)) == os.cpu_count(), timeout=15, what="alice grown")
    rec = c.restart_agent(NODE, argv=agent_stopping_at_write(c, 1))
    time.sleep(1.0)
    assert resize_as(c, ALICE, a, "cpus=1").returncode == 0
    wait_for(lambda: _stopped(rec.pid), timeout=8, what="agent hung inside a cycle")
    assert resize_as(c, ALICE, a, "max=node").returncode == 0
    b = submit_as(c, BOB, work, "bobhung", "grep Cpus_allowed_list /proc/self/status\n",
                  ["-N1", "-n1", f"-w{NODE}", f"--output={work}/bobhung-%j.out"])
    out = work / f"bobhung-{b}.out"
    wait_for(lambda: out.exists() and "Cpus_allowed_list" in out.read_text(), timeout=40,
             what="bob's job started", show=lambda: c.client().job(b).state)
    b_cpus = parse_cpu_list(out.read_text().split()[-1])
    assert not b_cpus & cores(c, a, uid)
    log = (c.paths.root / "agent" / f"hooks-{NODE}.log").read_text()
    assert f"killed the hung agent (pid {rec.pid})" in log
    daemons.reap_children()
    c.restart_agent(NODE)
    settle(c)


def test_a_storm_of_1000_resizes_from_several_users(agent_cluster, alice_job, work):
    c, (a, uid) = agent_cluster, alice_job
    b = tf_job(c, BOB, work, "bobtf", node=OTHER)
    buid = uid_of(BOB)
    wait_for(lambda: rank(c, b).get("intra_active"), timeout=240, what="bob's job training")
    results = {"alice": [], "bob": [], "bob-on-alice": []}

    def storm(user, job, n, key, last):
        for i in range(n):
            k = last if i == n - 1 else 1 + i % 2
            results[key].append(resize_as(c, user, job, f"cpus={k}").returncode)

    threads = [threading.Thread(target=storm, args=(ALICE, a, 500, "alice", 1)),
               threading.Thread(target=storm, args=(BOB, b, 400, "bob", 2)),
               threading.Thread(target=storm, args=(BOB, a, 100, "bob-on-alice", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results["alice"]) == {0} and set(results["bob"]) == {0}
    assert 0 not in results["bob-on-alice"]          # not bob's job: every one refused
    wait_for(lambda: len(cores(c, a, uid)) == 1 and len(cores(c, b, buid, OTHER)) == 2, timeout=20,
             what="the last requests applied", show=lambda: (cores(c, a, uid), cores(c, b, buid, OTHER)))
    settle(c)
    settle(c, OTHER)
    (work / f"stop-{b}").touch()
    time.sleep(1)
    c.client().cancel(b)
    # Ended, not only off its CPUs, before the next test stops slurmctld for 60 s: a step that
    # ends then retries its completion message to slurmctld, and slurmstepd's kill timer (started
    # by the cancel, UnkillableStepTimeout 60 s) drains the node "Kill task failed" (three CI
    # runs). Slurm frees a cancelled job's CPUs at once; the job leaves COMPLETING, and the
    # node its COMPLETING flag, only when every slurmstepd of it has reported and exited.
    def ended() -> bool:
        try:
            job_done = not c.client().job(b).state.holds_cores
        except UnknownJob:        # purged: long ended
            job_done = True
        return (job_done and "COMPLETING" not in slurm_node(c, OTHER).state_flags
                and cgroup_cpus(c, OTHER, b, uid=buid) is None)
    wait_for(ended, timeout=90, what="bob's job ended on an2",
             show=lambda: (c.client().job(b), slurm_node(c, OTHER)))


def test_a_job_name_that_is_not_utf8_freezes_no_feed(agent_cluster, alice_job, work):
    """Bob's held job named and commented with bytes that are not UTF-8 (squeue --json passes
    them raw; the watcher's strict decode failed every poll while the job was queued, and every
    node's feed froze): alice's resize still reaches her job in the time a poll takes."""
    c, (a, uid) = agent_cluster, alice_job
    got = subprocess.run(
        ["runuser", "-u", BOB, "--", "sbatch", "--parsable", "-H", f"--chdir={work}",
         "-J", "bad\udcff\udcfe", "--comment=\udcc3(", "--output=/dev/null", "--wrap=sleep 5"],
        env={**os.environ, **c.env()}, capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    held = int(got.stdout.strip().split(";")[0])
    try:
        raw = subprocess.run(["squeue", "--json", "-j", str(held)], env={**os.environ, **c.env()},
                             capture_output=True, timeout=60).stdout
        assert b"\xff" in raw or b"\\u00ff" in raw or b"\\udcff" in raw.lower(), raw[:400]
        time.sleep(3)           # the watcher polls with the held job in the queue
        assert resize_as(c, ALICE, a, "cpus=1").returncode == 0
        t0 = time.monotonic()
        wait_for(lambda: len(cores(c, a, uid)) == 1, timeout=15, what="alice's shrink",
                 show=lambda: cores(c, a, uid))
        print(f"\nalice's shrink with bob's non-UTF-8 job queued: {time.monotonic() - t0:.1f} s")
        assert resize_as(c, ALICE, a, "max=node").returncode == 0
        wait_for(lambda: len(cores(c, a, uid)) == os.cpu_count(), timeout=15,
                 what="alice's growth", show=lambda: cores(c, a, uid))
        settle(c)
    finally:
        c.client().cancel(held)


def test_slurmctld_stopped_for_60s(agent_cluster, alice_job):
    c, (a, uid) = agent_cluster, alice_job
    ctld = next(r for r in c.records() if r.name == "slurmctld")
    os.kill(ctld.pid, signal.SIGSTOP)
    seen = []
    try:
        t_end = time.monotonic() + 60
        while time.monotonic() < t_end:
            seen += violations(c, NODE)
            time.sleep(5)
        # A job could start meanwhile only if slurmctld ran; its Prolog would still work.
        env = {**os.environ, **c.env(), "SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "990201",
               "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0"}
        pro = subprocess.run([str(c.hooks_dir / "prolog.sh")], env=env, capture_output=True,
                             text=True, timeout=30)
        assert pro.returncode == 0, pro.stderr
        subprocess.run([str(c.hooks_dir / "epilog.sh")], env=env, capture_output=True, timeout=30)
    finally:
        os.kill(ctld.pid, signal.SIGCONT)
    assert seen == []
    wait_for(lambda: c.client().ping(), timeout=30, what="slurmctld back")
    state = c.client().job(a).state
    if state is JobState.RUNNING:     # Slurm may count its nodes as unresponsive meanwhile
        assert resize_as(c, ALICE, a, "cpus=1").returncode == 0
        wait_for(lambda: len(cores(c, a, uid)) == 1, timeout=20, what="resize after the stop")
        assert resize_as(c, ALICE, a, "max=node").returncode == 0
    settle(c)
    print(f"\nalice's job after slurmctld's 60 s stop: {state.value}")


def test_a_prolog_that_cannot_make_the_node_safe_keeps_the_job_off_the_node(
        agent_cluster, alice_job, work):
    """Fail closed, and what Slurm then does: the node's lock is held by a process that is not
    the agent (nothing the Prolog may kill), so the Prolog exits 1; slurmd drains the node and
    slurmctld requeues the job held. Nothing runs on a core another job holds."""
    import fcntl
    c = agent_cluster
    env = {**os.environ, **c.env()}
    with open(c.agent_config(NODE).lock_file, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        b = submit_as(c, BOB, work, "bobclosed", "echo ran\n",
                      ["-N1", "-n1", f"-w{NODE}", f"--output={work}/bobclosed-%j.out"])

        wait_for(lambda: drained(c, NODE), timeout=90,
                 what="the node drained after the Prolog failed",
                 show=lambda: c.client().nodes())
        def detail():
            return subprocess.run(["scontrol", "show", "job", str(b)], env=env,
                                  capture_output=True, text=True).stdout
        wait_for(lambda: "JobState=PENDING" in (d := detail()) and
                 "Reason=launch_failed_requeued_held" in d, timeout=60,
                 what="the job requeued held", show=detail)
        assert not (work / f"bobclosed-{b}.out").exists() or \
            "ran" not in (work / f"bobclosed-{b}.out").read_text()
    log = (c.paths.root / "agent" / f"hooks-{NODE}.log").read_text()
    assert f"prolog job {b}: NOT SAFE" in log
    reason = subprocess.run(["sinfo", "-h", "-n", NODE, "-o", "%E"], env=env,
                            capture_output=True, text=True).stdout
    print(f"\nnode {NODE}: {reason.strip()!r}; job {b}: requeued held")
    # The admin's way back: resume the node, release the job; it runs.
    subprocess.run(["scontrol", "update", f"NodeName={NODE}", "State=RESUME"], env=env,
                   check=True, capture_output=True)
    subprocess.run(["scontrol", "release", str(b)], env=env, check=True, capture_output=True)
    # Slurm makes a requeued job eligible cred_expire + 1 s later (Reason=BeginTime; 31 s in
    # the test clusters' slurm.conf): not waited here.
    subprocess.run(["scontrol", "update", f"JobId={b}", "StartTime=now"], env=env, check=True,
                   capture_output=True)
    wait_for(lambda: c.client().job(b).state is JobState.COMPLETED, timeout=90,
             what="bob's job ran once the node was safe", show=detail)
    settle(c)


# --- round 2: one job's input stops nothing but that job ------------------------------------

def rigid_job_runs(cluster, work: Path, name: str, node: str = NODE) -> frozenset[int]:
    """Bob's rigid one-core job on ``node``: its Prolog must pass (no drain) and it runs; its
    cores, as its own process saw them."""
    b = submit_as(cluster, BOB, work, name, "grep Cpus_allowed_list /proc/self/status\n",
                  ["-N1", "-n1", f"-w{node}", f"--output={work}/{name}-%j.out"])
    out = work / f"{name}-{b}.out"
    wait_for(lambda: out.exists() and "Cpus_allowed_list" in out.read_text(), timeout=60,
             what=f"bob's job {name} ran", show=lambda: cluster.client().job(b).state)
    node_state = slurm_node(cluster, node)
    assert "DRAIN" not in node_state.state_flags, node_state
    return parse_cpu_list(out.read_text().split()[-1])


def test_hostile_records_hold_only_their_own_job(agent_cluster, alice_job, work):
    """A record whose steps/s key is "²" (it stopped every cycle: bare ValueError), and 1,024
    records carrying CPU lists at their size limit (each cost ~0.5 s of root CPU to expand):
    alice's job is held to its allocation (a job-fault event), every cycle still runs, bob's
    job starts on the node (no drain), and alice grows again once her folder is clean."""
    c, (a, uid) = agent_cluster, alice_job
    assert resize_as(c, ALICE, a, "max=node").returncode == 0
    wait_for(lambda: len(cores(c, a, uid)) == os.cpu_count(), timeout=20, what="alice grown")
    seen = len(agent_events(c, NODE))
    folder = c.run_layout.job_dir(a)
    plant = f"""
import json, os
d = {str(folder)!r}
for n in os.listdir(d):       # an earlier attack's junk: this one needs the folder's inodes
    if n.startswith("junk_"):
        os.unlink(os.path.join(d, n))
r = json.load(open(d + "/" + sorted(n for n in os.listdir(d) if n.startswith("rank_"))[0]))
bad = dict(r, steps_per_s={{"\\u00b2": 1}}, rank=900)
open(d + "/rank_900.step_0.json", "w").write(json.dumps(bad))
lists = ",".join(str(2 * i) for i in range(700))
made = 0
for i in range(1024):
    try:
        open(d + f"/rank_{{1000 + i}}.step_0.json", "w").write(
            json.dumps(dict(r, rank=1000 + i, allowed_cpus=lists, share_cpus=lists)))
        made += 1
    except OSError:
        break
print(made)
"""
    got = run_as(ALICE, ["/usr/bin/python3", "-c", plant], os.environ)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "1024"
    wait_for(lambda: any(e["event"] == "job-fault" and f"job {a}:" in e["error"]
                         for e in agent_events(c, NODE)[seen:]), timeout=20,
             what="alice's job-fault",
             show=lambda: agent_events(c, NODE)[seen:][-5:])
    wait_for(lambda: len(cores(c, a, uid)) == 1, timeout=20, what="alice held to her allocation")
    b_cpus = rigid_job_runs(c, work, "bobr2")
    new = agent_events(c, NODE)[seen:]
    assert not b_cpus & cores(c, a, uid), (got.stdout, new[-12:])
    assert not [e for e in new if e["event"] == "cycle-error"], new
    assert not [e for e in new if e.get("status") == "failed"], new
    print(f"\n{got.stdout.strip()} hostile records planted; alice at {sorted(cores(c, a, uid))}"
          f" (its allocation), bob ran on {sorted(b_cpus)}")
    cleaned = run_as(ALICE, ["/usr/bin/python3", "-c", f"""
import os
d = {str(folder)!r}
for n in os.listdir(d):
    if n.startswith("rank_") and n.endswith(".step_0.json") and int(n[5:].split(".")[0]) >= 900:
        os.unlink(os.path.join(d, n))
"""], os.environ)
    assert cleaned.returncode == 0, cleaned.stderr
    ledger = c.paths.root / "agent" / f"ledger-{NODE}.json"
    wait_for(lambda: len(cores(c, a, uid)) == os.cpu_count(), timeout=30,
             what="alice grown again once her folder is clean",
             show=lambda: (cores(c, a, uid), agent_events(c, NODE)[-6:], ledger.read_text(),
                           sorted(os.listdir(folder))[:20]))
    settle(c)


def test_a_sealed_job_user_cannot_make_cpusets(agent_cluster, alice_job):
    """Alice's grown job: Slurm's step folders below it are root's now (v1 gave them to her),
    so she cannot make a cpuset that holds a borrowed core; nor can she open the node's lock."""
    c, (a, uid) = agent_cluster, alice_job
    assert resize_as(c, ALICE, a, "max=node").returncode == 0
    wait_for(lambda: len(cores(c, a, uid)) == os.cpu_count(), timeout=20, what="alice grown")
    layout = c.cgroup_layout(NODE)
    steps = [d for d in layout.job_dir(uid, a).iterdir() if d.is_dir()]
    assert steps
    for d in steps:
        got = run_as(ALICE, ["mkdir", str(d / "mine")], os.environ)
        assert got.returncode != 0 and "Permission denied" in got.stderr, (d, got)
    lock = c.agent_config(NODE).lock_file
    got = run_as(ALICE, ["/usr/bin/python3", "-c", f"open({str(lock)!r})"], os.environ)
    assert got.returncode != 0 and "PermissionError" in got.stderr, got
    settle(c)


def test_a_users_own_cgroup_tree_is_his_jobs_fault_only(agent_cluster, users, work):
    """Bob's job (malleable, never lent a core: max=1) nests 1,200 cpusets in its own batch
    step folder (v1 gives it to him; the agent walked every folder: RecursionError on each
    restart). The agent reports his job's fault and keeps every cycle; a new job of alice's
    starts on the node (no drain); when bob's job ends, the Epilog removes what Slurm could
    not (a job folder left behind would hold its cores against the next job)."""
    c = agent_cluster
    node_usable(c, OTHER)
    seen = len(agent_events(c, OTHER))
    b = submit_as(c, BOB, work, "bobtree", """
python3 - "$(cat /proc/self/cpuset)" <<'PYEOF'
import os, sys
d = HIERARCHY + sys.argv[1]
cpus, mems = (open(f"{d}/cpuset.{k}").read().strip() for k in ("cpus", "mems"))
os.chdir(d)
for i in range(1200):
    os.mkdir("x")
    os.chdir("x")
    if i < 3:
        open("cpuset.mems", "w").write(mems)
        open("cpuset.cpus", "w").write(cpus)
print("nested 1200", flush=True)
PYEOF
sleep 120
""".replace("HIERARCHY", repr(str(c.cgroup_hierarchy(OTHER)))), ["-N1", "-n1", f"-w{OTHER}", "--comment=malleable:min=1,max=1",
      f"--output={work}/bobtree-%j.out"])
    out = work / f"bobtree-{b}.out"
    try:
        hooks_log = c.paths.root / "agent" / f"hooks-{OTHER}.log"
        wait_for(lambda: out.exists() and "nested 1200" in out.read_text(), timeout=120,
                 what="bob's tree made",
                 show=lambda: (out.exists() and out.read_text()[-500:], c.client().job(b).state,
                               slurm_node(c, OTHER),
                               hooks_log.exists() and hooks_log.read_text()[-1500:]))
        wait_for(lambda: any(e["event"] == "job-fault" and f"job {b}:" in e["error"]
                             for e in agent_events(c, OTHER)[seen:]), timeout=20,
                 what="bob's job-fault", show=lambda: agent_events(c, OTHER)[seen:][-5:])
        a_cpus = submit_as(c, ALICE, work, "alicer2", "grep Cpus_allowed_list /proc/self/status\n",
                           ["-N1", "-n1", f"-w{OTHER}", f"--output={work}/alicer2-%j.out"])
        a_out = work / f"alicer2-{a_cpus}.out"
        wait_for(lambda: a_out.exists() and "Cpus_allowed_list" in a_out.read_text(),
                 timeout=60, what="alice's job ran beside bob's tree")
        new = agent_events(c, OTHER)[seen:]
        assert not [e for e in new if e["event"] == "cycle-error"], new
        settle(c, OTHER)
    finally:
        c.client().cancel(b)
        wait_for(lambda: not c.client().job(b).state.holds_cores, timeout=60, what="bob's end")
    job_dir = c.cgroup_layout(OTHER).job_dir(uid_of(BOB), b)
    wait_for(lambda: not job_dir.exists(), timeout=30, what="bob's cgroup tree removed")
    settle(c, OTHER)


def bob_job_on_other(c, work: Path, name: str, script: str, comment: str) -> tuple[int, Path]:
    """A job of bob's on OTHER running ``script`` (bash) with ``$STEP``, its step's cpuset
    folder, and ``$H``, the cpuset hierarchy, set; it writes its markers to its output."""
    b = submit_as(c, BOB, work, name, (
        f"H={str(c.cgroup_hierarchy(OTHER))!r}\n"
        'STEP=$(cat /proc/self/cpuset); case ${STEP##*/} in task_*) STEP=${STEP%/*};; esac\n'
        + script), ["-N1", "-n1", f"-w{OTHER}", f"--comment={comment}",
                    f"--output={work}/{name}-%j.out", "--time=5"])
    return b, work / f"{name}-{b}.out"


def rigid_job_on_other_runs(c, work: Path, name: str) -> int:
    """Alice's rigid one-CPU job on OTHER starts and runs: not requeued, not held, the node
    not drained."""
    a = submit_as(c, ALICE, work, name, "grep Cpus_allowed_list /proc/self/status\n",
                  ["-N1", "-n1", f"-w{OTHER}", f"--output={work}/{name}-%j.out"])
    out = work / f"{name}-{a}.out"
    wait_for(lambda: out.exists() and "Cpus_allowed_list" in out.read_text(), timeout=60,
             what=f"alice's {name} ran", show=lambda: (c.client().job(a), slurm_node(c, OTHER)))
    assert not drained(c, OTHER)
    assert c.client().job(a).state.value in ("COMPLETED", "RUNNING", "COMPLETING"), \
        c.client().job(a)
    return a


def test_a_folder_named_as_slurm_names_it_is_the_users_jobs_fault_only(agent_cluster, users,
                                                                       work):
    """Finding 3 of issue 40: bob's malleable job (one CPU, may grow to the node's two) makes
    task_4242 in its own v1 step folder as it starts and keeps writing its step's CPU list
    into it. Its files are bob's (the kernel's rule), so it is not Slurm's: bob's job is not
    grown (or, if the agent sealed the step first, the mkdir is refused), and alice's rigid
    job sent to the other core starts; the node is not drained."""
    c = agent_cluster
    node_usable(c, OTHER)
    seen = len(agent_events(c, OTHER))
    b, out = bob_job_on_other(c, work, "bobtask", """
if mkdir "$H$STEP/task_4242"; then
  cat "$H$STEP/cpuset.mems" > "$H$STEP/task_4242/cpuset.mems"
  echo made
  while :; do cat "$H$STEP/cpuset.cpus" > "$H$STEP/task_4242/cpuset.cpus"; sleep 0.05; done &
else
  echo refused
fi
sleep 120
""", "malleable:min=1,max=node")
    buid = uid_of(BOB)
    try:
        wait_for(lambda: out.exists() and out.read_text().strip(), timeout=60,
                 what="bob's folder attempt", show=lambda: c.client().job(b))
        made = "made" in out.read_text()
        print(f"\nbob's task_4242: {'made' if made else 'refused (the agent sealed first)'}")
        if made:
            wait_for(lambda: any(e["event"] == "job-fault" and f"job {b}:" in e["error"]
                                 and "task_4242" in e["error"]
                                 for e in agent_events(c, OTHER)[seen:]), timeout=20,
                     what="bob's job-fault", show=lambda: agent_events(c, OTHER)[seen:][-5:])
            time.sleep(3)       # cycles with the idle core there to lend
            assert len(cores(c, b, buid, OTHER)) == 1
        rigid_job_on_other_runs(c, work, "alicer3")
        settle(c, OTHER)
    finally:
        c.client().cancel(b)
        wait_for(lambda: not c.client().job(b).state.holds_cores, timeout=60, what="bob's end")
    node_usable(c, OTHER)


def test_a_users_process_titled_as_another_jobs_slurmstepd_is_not_one(agent_cluster, users,
                                                                      work):
    """Finding 2 of issue 40: bob runs a process named slurmstepd, titled as the slurmstepd of
    the next job ("slurmstepd: [X.0]"), in a folder job_X he made in his own step cgroup.
    Taken by its name it is job X's slurmstepd in the wrong place (the Prolog of X failed:
    drain, requeue held). The agent's view of slurmstepd processes (read here, on the same
    /proc) leaves it out: its uids are bob's; alice's job X starts on the node."""
    from slurm_plugin.cgroups import misplaced_jobs, parse_stepd_title, slurmstepd_processes
    c = agent_cluster
    node_usable(c, OTHER)
    b, out = bob_job_on_other(c, work, "bobstepd", """
X=$((SLURM_JOB_ID + 1))
mkdir "$H$STEP/job_$X"
cat "$H$STEP/cpuset.mems" > "$H$STEP/job_$X/cpuset.mems"
cat "$H$STEP/cpuset.cpus" > "$H$STEP/job_$X/cpuset.cpus"
F=/tmp/bobfake-$SLURM_JOB_ID; mkdir -p $F; cp /bin/sleep $F/slurmstepd
( echo $BASHPID > "$H$STEP/job_$X/tasks"; exec -a "slurmstepd: [$X.0]" $F/slurmstepd 120 ) &
sleep 1; echo "impostor $! for $X"
sleep 120
""", "malleable:min=1,max=1")
    try:
        wait_for(lambda: out.exists() and "impostor" in out.read_text(), timeout=60,
                 what="bob's impostor", show=lambda: (c.client().job(b),
                                                      out.exists() and out.read_text()))
        _, pid, _, x = out.read_text().split()[:4]
        pid, x = int(pid), int(x)
        comm = Path(f"/proc/{pid}/comm").read_bytes().strip()
        title = parse_stepd_title(Path(f"/proc/{pid}/cmdline").read_bytes())
        cgroup = Path(f"/proc/{pid}/cpuset").read_text().strip()
        assert (comm, title) == (b"slurmstepd", x) and cgroup.endswith(f"/job_{x}"), \
            (comm, title, cgroup)     # by its name and title, job X's slurmstepd
        stepds = slurmstepd_processes()
        assert pid not in [p.pid for p in stepds]
        assert misplaced_jobs(c.cgroup_layout(OTHER), [x], stepds) == {}
        seen = len(agent_events(c, OTHER))
        a = rigid_job_on_other_runs(c, work, "alicer4")
        print(f"\nbob's impostor {pid} titled for job {x}; alice's job {a} ran")
        assert not [e for e in agent_events(c, OTHER)[seen:]
                    if e["event"] in ("job-fault", "cycle-error") and f"job {a}" in
                    e.get("error", "")]
        settle(c, OTHER)
    finally:
        c.client().cancel(b)
        wait_for(lambda: not c.client().job(b).state.holds_cores, timeout=60, what="bob's end")
    node_usable(c, OTHER)


def mounts_at_or_below(folder: Path) -> list[str]:
    from slurm_plugin.node.jobfs import node_mounts
    return [f"{m.fstype} {m.point}" for m in node_mounts()
            if m.point == str(folder) or m.point.startswith(f"{folder}/")]


def test_a_file_system_mounted_on_a_jobs_records_folder_is_its_jobs_fault_only(
        agent_cluster, users, work):
    """Finding 5 of issue 40: bob's malleable job mounts a FUSE file system (bindfs, through
    the set-uid fusermount3) on its own records folder. Root gets EACCES there, so the Epilog
    saw no mount point, never unmounted, could not remove the folder, and the requeued job's
    Prolog failed (drain, requeue held). Now: the agent does not open the folder (bob's
    job-fault, from the kernel's mount table), the requeue's Epilog detaches both mounts, the
    Prolog makes a fresh folder, the job runs again; at its end nothing is left mounted and
    the node is not drained."""
    c = agent_cluster
    node_usable(c, OTHER)
    seen = len(agent_events(c, OTHER))
    b, out = bob_job_on_other(c, work, "bobfuse", f"""
J={c.run_layout.jobs_dir}/job_$SLURM_JOB_ID
mkdir -p /tmp/bobsrc-$SLURM_JOB_ID
if bindfs --no-allow-other /tmp/bobsrc-$SLURM_JOB_ID "$J"; then
  echo "mounted, run ${{SLURM_RESTART_COUNT:-0}}"
fi
sleep 120
""", "malleable:min=1,max=node")
    folder = c.run_layout.job_dir(b)
    try:
        wait_for(lambda: out.exists() and "mounted" in out.read_text(), timeout=60,
                 what="bob's FUSE mount", show=lambda: (c.client().job(b),
                                                        out.exists() and out.read_text()))
        assert [m.split()[0] for m in mounts_at_or_below(folder)] == ["tmpfs", "fuse"]
        with pytest.raises(PermissionError):
            os.listdir(folder)               # root's own view of it
        wait_for(lambda: any(e["event"] == "job-fault" and f"job {b}:" in e["error"]
                             and "mounted" in e["error"] for e in agent_events(c, OTHER)[seen:]),
                 timeout=20, what="bob's job-fault", show=lambda: agent_events(c, OTHER)[seen:])
        env = {**os.environ, **c.env()}
        t0 = time.monotonic()
        subprocess.run(["scontrol", "requeue", str(b)], env=env, check=True, capture_output=True)
        # Slurm starts a requeued batch job again cred_expire + 1 s later (its BeginTime; 31 s
        # in the test clusters, 121 s by default); not
        # sooner: slurmd runs no Prolog for a job id whose credential it still holds (seen here
        # with StartTime=now: the job ran again without its folder).
        wait_for(lambda: out.exists() and "mounted, run 1" in out.read_text() and
                 c.client().job(b).state is JobState.RUNNING and
                 len(mounts_at_or_below(folder)) == 2, timeout=240,
                 what="bob's job running again", show=lambda: (
                     c.client().job(b), mounts_at_or_below(folder), out.read_text()[-800:],
                     (c.paths.root / "agent" / f"hooks-{OTHER}.log").read_text()[-800:]))
        print(f"\nbob's job requeued and mounted again in {time.monotonic() - t0:.0f} s")
        assert not drained(c, OTHER)
        assert not [e for e in agent_events(c, OTHER)[seen:] if e["event"] == "cycle-error"]
    finally:
        c.client().cancel(b)
        wait_for(lambda: not c.client().job(b).state.holds_cores, timeout=60, what="bob's end")
    wait_for(lambda: not mounts_at_or_below(folder) and not folder.exists(), timeout=30,
             what="bob's folder unmounted and removed", show=lambda: mounts_at_or_below(folder))
    assert not drained(c, OTHER)
    node_usable(c, OTHER)


def test_a_process_moved_into_a_users_own_folder_does_not_outlive_his_job(agent_cluster, users,
                                                                          work):
    """Issue 40, finding 8 (v1): bob's job starts a process in a session of its own and moves
    it into folders he made in his step's cpuset and freezer folders (v1 gives him both).
    Slurm kills what its step folders list, not what is below them; the process ran on past
    the job, in a cpuset folder holding the job's cores, beside the next job. When the job
    ends, the Epilog kills what runs in the folders its user made (the user's own processes,
    checked through a pidfd) and removes them."""
    c = agent_cluster
    node_usable(c, OTHER)
    b, out = bob_job_on_other(c, work, "bobescape", """
F=/sys/fs/cgroup/freezer$(grep ':freezer:' /proc/self/cgroup | cut -d: -f3)
setsid sleep 300 < /dev/null > /dev/null 2>&1 &
P=$!
for D in "$H$STEP" "$F"; do
  if mkdir "$D/mine"; then
    if [ -f "$D/cpuset.cpus" ]; then
      cat "$D/cpuset.mems" > "$D/mine/cpuset.mems"; cat "$D/cpuset.cpus" > "$D/mine/cpuset.cpus"
    fi
    echo $P > "$D/mine/cgroup.procs" && echo "moved into $D/mine"
  fi
done
echo "pid $P"
sleep 120
""", "malleable:min=1,max=1")
    buid = uid_of(BOB)
    try:
        wait_for(lambda: out.exists() and "pid " in out.read_text(), timeout=60,
                 what="bob's process moved", show=lambda: c.client().job(b))
    finally:
        c.client().cancel(b)
        wait_for(lambda: not c.client().job(b).state.holds_cores, timeout=60, what="bob's end")
    text = out.read_text()
    print("\n" + text)
    assert "moved into" in text and "/mine" in text, text
    pid = int(text.split("pid ")[1].split()[0])

    def gone() -> bool:
        try:
            return os.stat(f"/proc/{pid}").st_uid != buid
        except FileNotFoundError:
            return True
    job_dir = c.cgroup_layout(OTHER).job_dir(buid, b)
    wait_for(lambda: gone() and not job_dir.exists(), timeout=30,
             what="bob's escaped process killed and his job's cgroup folder removed",
             show=lambda: (os.path.exists(f"/proc/{pid}"), job_dir.exists(),
                           (c.paths.root / "agent" / f"hooks-{OTHER}.log").read_text()[-800:]))
    node_usable(c, OTHER)
