"""The co-scheduler on the real cluster: agents per node, Prolog, job_submit.lua, real cgroups
and a real malleable TensorFlow (Horovod) rank in the malleable job."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sbatch_templates import render
from slurm_plugin.cluster import daemons
from malleable_protocol.cpulist import parse_cpu_list
from slurm_plugin.slurm import JobState

from .helpers import (agent_events, cgroup_cpus, job_cpus_shell, rank_statuses, stop_then_cancel,
                      wait_for)

pytestmark = pytest.mark.cluster
PROGRAM = Path(__file__).parent.parent / "programs" / "hvd_train.py"
NODE = "an1"


def job_cpus(cluster, job_id: int, step: str | None = None) -> frozenset[int] | None:
    return cgroup_cpus(cluster, NODE, job_id, step or "")


def cpus_of(cluster, job, step: str | None = None) -> str:
    """In a job script: the CPUs of ``job`` on NODE (``job_cpus_shell``)."""
    return job_cpus_shell(NODE, job, step, slurm_conf=cluster.paths.slurm_conf)


def rank_status(cluster, job_id: int) -> dict | None:
    """The status record of the job's one rank, once it has written one."""
    found = rank_statuses(cluster.run_layout.job_dir(job_id))
    return next(iter(found.values()), None)


def submit_malleable(cluster, tmp_path, stop: Path) -> int:
    """A malleable Horovod job from the single-node template, launched by malleable-srun."""
    script = tmp_path / "a.sbatch"
    script.write_text(render("single-node", {
        "program": str(PROGRAM), "args": f"{stop} 1000000", "ntasks": "1", "time": "10",
        "output": f"{tmp_path}/a.out", "python": sys.executable,
        "launcher": str(Path(sys.executable).with_name("malleable-srun"))}))
    tmp_path.chmod(0o755)
    return cluster.client().submit(script, [f"-w{NODE}"])


def test_malformed_submit_is_refused_with_a_message(agent_cluster):
    out = subprocess.run(["sbatch", "--comment=malleable:min=2,max=1", "--wrap=true"],
                         capture_output=True, text=True, env={**os.environ, **agent_cluster.env()})
    assert out.returncode != 0
    assert "malleable: refused 'malleable:min=2,max=1': min is above max" in out.stderr


def test_the_malleable_option_reaches_job_submit_and_a_bad_one_is_refused(agent_cluster):
    """--malleable, the SPANK plugin's option: listed by sbatch --help; passed to slurmctld in
    the job's SPANK environment; normalised into AdminComment by job_submit.lua; a malformed
    value, a typo of the option or of the comment's prefix never gives a rigid job silently."""
    env = {**os.environ, **agent_cluster.env()}

    def sbatch(*args):
        return subprocess.run(["sbatch", "--parsable", "--hold", *args, "--wrap=true"],
                              capture_output=True, text=True, env=env)

    helptext = subprocess.run(["sbatch", "--help"], capture_output=True, text=True, env=env)
    assert "--malleable=MIN[:MAX[:WEIGHT]]|off" in helptext.stdout, helptext.stdout[-1500:]
    client = agent_cluster.client()
    made = []
    try:
        for option, admin in [("--malleable=2:node:1", "malleable:min=2,max=node,weight=1"),
                              ("--malleable=1", "malleable:min=1,max=node,weight=1"),
                              ("--malleable=1:2", "malleable:min=1,max=2,weight=1"),
                              ("--malleable=off", "")]:
            out = sbatch(option)
            assert out.returncode == 0, (option, out.stderr)
            made.append(int(out.stdout.split(";")[0]))
            assert client.job(made[-1]).admin_comment == admin, option
        # salloc and srun (a job of its own) pass it the same way.
        got = subprocess.run(["salloc", "--malleable=1:2", "--no-shell", "-N1", "-c1",
                              "--immediate=30"],
                             capture_output=True, text=True, env=env, timeout=60)
        assert "Granted job allocation " in got.stderr, got
        made.append(int(got.stderr.split("Granted job allocation ")[1].split()[0]))
        assert client.job(made[-1]).admin_comment == "malleable:min=1,max=2,weight=1"
        got = subprocess.run(["srun", "--malleable=1:node:1", "-N1", "bash", "-c",
                              "scontrol show job $SLURM_JOB_ID"],
                             capture_output=True, text=True, env=env, timeout=120)
        assert "AdminComment=malleable:min=1,max=node,weight=1" in got.stdout, got
        for args, said in [(["--malleable=2:1"], "--malleable=MIN[:MAX[:WEIGHT]]"),
                           (["--malleable=x"], "--malleable=MIN[:MAX[:WEIGHT]]"),
                           (["--malleable=1", "--comment=malleable:min=1"], "use --malleable only"),
                           (["--comment=maleable:min=1,max=2"], "looks like a malleability"),
                           (["--maleable=1:2"], "unrecognized option")]:
            out = sbatch(*args)
            assert out.returncode != 0 and said in out.stderr, (args, out.stderr)
    finally:
        for job_id in made:
            client.cancel(job_id)


def test_borrow_give_back_before_start_and_grow_back(agent_cluster, tmp_path):
    c = agent_cluster
    client = c.client()
    stop = tmp_path / "stop"
    a = submit_malleable(c, tmp_path, stop)
    try:
        job_a = wait_for(lambda: (lambda j: j if j.state is JobState.RUNNING else None)(client.job(a)),
                         what="A running")
        assert job_a.admin_comment == "malleable:min=1,max=node,weight=1"
        all_cpus = frozenset(range(os.cpu_count()))
        # A alone on the node: it borrows every idle core and its rank runs that many threads.
        wait_for(lambda: job_cpus(c, a) == all_cpus and job_cpus(c, a, "step_0") == all_cpus,
                 timeout=60, what="A grown",
                 show=lambda: (job_cpus(c, a), client.job(a).state, (tmp_path / "a.out").read_text()[-1500:]))
        wait_for(lambda: (st := rank_status(c, a)) and st["intra_active"] == len(all_cpus),
                 timeout=120, what="A's rank at all cores", show=lambda: rank_status(c, a))
        # B arrives on the node: A gives the cores back before B's batch script starts.
        b_script = tmp_path / "b.sh"
        b_script.write_text(
            "#!/bin/bash\n"
            f"echo B={cpus_of(c, '$SLURM_JOB_ID')} A={cpus_of(c, a)}"
            f" A_step={cpus_of(c, a, 'step_0')}\n"
            "sleep 4\n")
        b = client.submit(b_script, ["-N1", f"-w{NODE}", "-n1", f"--output={tmp_path}/b.out"])
        wait_for(lambda: (tmp_path / "b.out").exists() and "B=" in (tmp_path / "b.out").read_text(),
                 timeout=30, what="B started")
        fields = dict(kv.split("=") for kv in (tmp_path / "b.out").read_text().split())
        b_cpus, a_cpus = parse_cpu_list(fields["B"]), parse_cpu_list(fields["A"])
        assert not (b_cpus & a_cpus), fields                    # no core in both at B's start
        assert not (b_cpus & parse_cpu_list(fields["A_step"])), fields
        wait_for(lambda: (st := rank_status(c, a)) and st["intra_active"] == len(a_cpus),
                 timeout=10, what="A's threads down", show=lambda: rank_status(c, a))
        # B ends: A grows back.
        wait_for(lambda: client.job(b).state is JobState.COMPLETED, timeout=30, what="B done")
        wait_for(lambda: job_cpus(c, a) == all_cpus, timeout=10, what="A grown back")
        wait_for(lambda: (st := rank_status(c, a)) and st["intra_active"] == len(all_cpus),
                 timeout=10, what="A's threads back up", show=lambda: rank_status(c, a))
        # Every resize is in the event log (written once the cycle's cgroup writes are done).
        def mine():
            return [e for e in agent_events(c, NODE) if e.get("job") == a]
        wait_for(lambda: len(mine()) >= 3, timeout=10, what="A's three resize events", show=mine)
        assert all({"before", "after", "reason", "latency_ms"} <= set(e) for e in mine())

        # scontrol update by the owner: cpus=1, then a malformed one that changes nothing.
        subprocess.run(["scontrol", "update", f"JobId={a}", "Comment=malleable:cpus=1"],
                       check=True, env={**os.environ, **c.env()}, capture_output=True)
        wait_for(lambda: job_cpus(c, a) is not None and len(job_cpus(c, a)) == 1, timeout=5,
                 what="A at 1 core")
        wait_for(lambda: (st := rank_status(c, a)) and st["intra_active"] == 1, timeout=5,
                 what="A's rank at 1 thread")
        bad = subprocess.run(["scontrol", "update", f"JobId={a}", "Comment=malleable:cpus=-3"],
                             env={**os.environ, **c.env()}, capture_output=True, text=True)
        assert bad.returncode != 0
        assert client.job(a).comment == "malleable:cpus=1"
        time.sleep(1.5)
        assert len(job_cpus(c, a)) == 1
    finally:
        stop_then_cancel(client, a, stop)
    wait_for(lambda: not client.job(a).state.holds_cores, timeout=60, what="A ended")


def test_kill_9_agent_during_resizes_then_restart_converges(agent_cluster, tmp_path):
    c = agent_cluster
    client = c.client()
    stop = tmp_path / "stop"
    a = submit_malleable(c, tmp_path, stop)
    rng = random.Random(3)
    try:
        wait_for(lambda: job_cpus(c, a, "step_0") is not None, timeout=60, what="A's step")
        rec = next(r for r in c.records() if r.name == f"agent {NODE}")
        for i in range(6):
            subprocess.run(["scontrol", "update", f"JobId={a}",
                            f"Comment=malleable:cpus={1 + i % 2}"], check=True,
                           env={**os.environ, **c.env()}, capture_output=True)
            time.sleep(rng.uniform(0.0, 0.6))
        os.kill(rec.pid, signal.SIGKILL)
        daemons.reap_children()
        # With the agent dead, a job arrives on cores A may hold: the Prolog alone takes them
        # back before the job starts (it runs the same reconcile step under the node lock).
        subprocess.run(["scontrol", "update", f"JobId={a}", "Comment=malleable:max=node"],
                       check=True, env={**os.environ, **c.env()}, capture_output=True)
        b_out = tmp_path / "b.out"
        b_script = tmp_path / "b.sh"
        b_script.write_text(
            "#!/bin/bash\n"
            f"echo B={cpus_of(c, '$SLURM_JOB_ID')} A={cpus_of(c, a)}\n")
        client.submit(b_script, ["-N1", f"-w{NODE}", "-n1", f"--output={b_out}"])
        wait_for(lambda: b_out.exists() and "B=" in b_out.read_text(), timeout=30, what="B ran")
        fields = dict(kv.split("=") for kv in b_out.read_text().split())
        assert not (parse_cpu_list(fields["B"]) & parse_cpu_list(fields["A"])), fields
        restart = subprocess.run([sys.executable, "-m", "slurm_plugin.commands.main", "agent", "--once",
                                  "--config", str(c.hooks_dir / "agent.json"), "--node", NODE],
                                 capture_output=True, text=True, timeout=60)
        assert restart.returncode == 0, restart.stderr
        # The restarted agent (one cycle) converges: A has what lend-idle gives it now that B
        # is gone, its step agrees with its job folder.
        wait_for(lambda: not any(j.state.holds_cores and j.job_id != a for j in client.jobs()),
                 timeout=30, what="B gone")
        again = subprocess.run([sys.executable, "-m", "slurm_plugin.commands.main", "agent", "--once",
                                "--config", str(c.hooks_dir / "agent.json"), "--node", NODE],
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 0, again.stderr
        assert job_cpus(c, a) == frozenset(range(os.cpu_count()))
        assert job_cpus(c, a, "step_0") == job_cpus(c, a)
    finally:
        stop_then_cancel(client, a, stop)
        c.restart_agent(NODE)       # as its service manager would


def test_metrics_endpoint_on_loopback(agent_cluster):
    import urllib.error
    import urllib.request
    port = agent_cluster.spec.metrics_port("an2")   # an1's agent may have been killed above

    def scrape():
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        except urllib.error.URLError:
            return None   # the agent is still starting
        return text.decode() if b"malleable_cycle_seconds_count" in text else None

    text = wait_for(scrape, timeout=20, what="metrics")
    assert 'malleable_cycle_seconds_count{node="an2"}' in text
    count = float(text.split('malleable_cycle_seconds_count{node="an2"}')[1].split()[0])
    assert count >= 1
    assert 'malleable_resizes_total{node="an2"}' in text


def test_only_the_owner_can_ask_for_a_resize(agent_cluster, tmp_path):
    """Two real local users: the owner's scontrol update is taken, another user's refused."""
    env = {**os.environ, **agent_cluster.env()}
    users = ["mtowner", "mtother"]
    for u in users:
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", u], capture_output=True)
    try:
        tmp_path.chmod(0o777)
        sub = subprocess.run(["runuser", "-u", "mtowner", "--", "sbatch", "--parsable", "-N1",
                              f"-w{NODE}", "-n1", "--comment=malleable:min=1,max=node",
                              "--output=/dev/null", f"--chdir={tmp_path}", "--wrap=sleep 30"],
                             capture_output=True, text=True, env=env)
        assert sub.returncode == 0, sub.stderr
        job_id = int(sub.stdout.strip())
        client = agent_cluster.client()
        wait_for(lambda: client.job(job_id).state is JobState.RUNNING, what="running")
        other = subprocess.run(["runuser", "-u", "mtother", "--", "scontrol", "update",
                                f"JobId={job_id}", "Comment=malleable:cpus=1"],
                               capture_output=True, text=True, env=env)
        # Slurm 22.05 says "Invalid user id for job N" to a user who does not own the job.
        assert other.returncode != 0 and "Invalid user id" in other.stderr, other.stderr
        assert client.job(job_id).comment == "malleable:min=1,max=node"
        owner = subprocess.run(["runuser", "-u", "mtowner", "--", "scontrol", "update",
                                f"JobId={job_id}", "Comment=malleable:cpus=1"],
                               capture_output=True, text=True, env=env)
        assert owner.returncode == 0, owner.stderr
        assert client.job(job_id).comment == "malleable:cpus=1"
        # The owner cannot write AdminComment, where the trusted bounds live.
        forge = subprocess.run(["runuser", "-u", "mtowner", "--", "scontrol", "update",
                                f"JobId={job_id}", "AdminComment=malleable:min=1,max=64,weight=100"],
                               capture_output=True, text=True, env=env)
        assert forge.returncode != 0
        assert client.job(job_id).admin_comment == "malleable:min=1,max=node,weight=1"
        client.cancel(job_id)
        wait_for(lambda: not client.job(job_id).state.holds_cores, what="job gone")
    finally:
        for u in users:
            # userdel refuses while a process of the user lives: wait for the job's to go.
            for _ in range(100):
                if subprocess.run(["userdel", u], capture_output=True).returncode in (0, 6):
                    break
                time.sleep(0.2)




def test_prolog_reclaims_with_slurmctld_stopped(agent_cluster, tmp_path):
    """The Prolog asks slurmctld nothing: with slurmctld frozen (any call would hang), the node's
    Prolog, run as slurmd runs it, takes every lent core back in bounded time."""
    c = agent_cluster
    client = c.client()
    tmp_path.chmod(0o755)
    sub = subprocess.run(["sbatch", "--parsable", "-N1", f"-w{NODE}", "-n1",
                          "--comment=malleable:min=1,max=node", "--output=/dev/null",
                          "--wrap=sleep 120"], capture_output=True, text=True,
                         env={**os.environ, **c.env()}, check=True)
    a = int(sub.stdout.strip())
    cores = frozenset(range(os.cpu_count()))
    ctld = next(r for r in c.records() if r.name == "slurmctld")
    try:
        wait_for(lambda: job_cpus(c, a) == cores, timeout=30, what="A grown")
        os.kill(ctld.pid, signal.SIGSTOP)
        env = {**os.environ, **c.env(), "SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "990001",
               "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0"}
        t0 = time.monotonic()
        pro = subprocess.run([str(c.hooks_dir / "prolog.sh")], env=env, capture_output=True,
                             text=True, timeout=30)
        seconds = time.monotonic() - t0
        assert pro.returncode == 0, pro.stderr
        assert len(job_cpus(c, a)) == 1 and seconds < 5, (job_cpus(c, a), seconds)
        # The job's status folder was made for its user; the Epilog removes it and A regrows.
        assert c.run_layout.job_dir(990001).is_dir()
        epi = subprocess.run([str(c.hooks_dir / "epilog.sh")], env=env, capture_output=True,
                             text=True, timeout=30)
        assert epi.returncode == 0, epi.stderr
        assert not c.run_layout.job_dir(990001).exists()
        wait_for(lambda: job_cpus(c, a) == cores, timeout=10, what="A regrown, slurmctld stopped")
    finally:
        os.kill(ctld.pid, signal.SIGCONT)
        client.cancel(a)
    wait_for(lambda: not client.job(a).state.holds_cores, timeout=60, what="A ended")


def test_a_multi_node_job_is_held_to_its_slowest_node(agent_cluster, tmp_path):
    """A synchronous 2-node Horovod job: when a job arrives on one of its nodes and takes a core
    back there, the job's other node holds it to the same cores per rank (the surplus is free
    for other jobs) instead of letting it wait at every allreduce."""
    c = agent_cluster
    client = c.client()
    tmp_path.chmod(0o755)
    stop = tmp_path / "stop"
    script = tmp_path / "a.sbatch"
    script.write_text(render("multi-node", {
        "program": str(PROGRAM), "args": f"{stop} 1000000", "nodes": "2",
        "tasks_per_node": "1", "output": f"{tmp_path}/a.out", "time": "10",
        "python": sys.executable,
        "launcher": str(Path(sys.executable).with_name("malleable-srun"))}))
    a = client.submit(script)
    cores = frozenset(range(os.cpu_count()))
    other = "an2"

    def ranks():
        return rank_statuses(c.run_layout.job_dir(a))

    try:
        wait_for(lambda: cgroup_cpus(c, NODE, a) == cores and cgroup_cpus(c, other, a) == cores,
                 timeout=120, what="A grown on both nodes")
        wait_for(lambda: len(st := ranks()) == 2 and
                 all(s["intra_active"] == len(cores) and str(len(cores)) in s["steps_per_s"]
                     for s in st.values()), timeout=240, what="A training on all cores",
                 show=ranks)
        def pace(seconds=6.0):
            """The job's steps/s (every rank's step counter over a window) and its cores."""
            s0 = {r: s["steps"] for r, s in ranks().items()}
            time.sleep(seconds)
            s1 = {r: s["steps"] for r, s in ranks().items()}
            held = len(cgroup_cpus(c, NODE, a)) + len(cgroup_cpus(c, other, a))
            return round(min(s1[r] - s0[r] for r in s0) / seconds, 1), held

        before = pace()
        b = client.submit(_sleeper(tmp_path, 40), ["-N1", f"-w{NODE}", "-n1"])
        wait_for(lambda: client.job(b).state is JobState.RUNNING, timeout=30, what="B running")
        # NODE gave the core back to B; the other node holds A to one core per rank too.
        wait_for(lambda: len(cgroup_cpus(c, NODE, a)) == 1 and len(cgroup_cpus(c, other, a)) == 1,
                 timeout=15, what="A at one core on both nodes",
                 show=lambda: (cgroup_cpus(c, NODE, a), cgroup_cpus(c, other, a)))
        # The cycle logs its events after it has written the cgroups: wait for the line.
        wait_for(lambda: any(e.get("job") == a and e.get("reason") == "peer-cap" and
                             e["status"] == "applied" for e in agent_events(c, other)),
                 timeout=10, what="the peer-cap event", show=lambda: agent_events(c, other)[-5:])
        wait_for(lambda: all(s["intra_active"] == 1 and "1" in s["steps_per_s"]
                             for s in ranks().values()), timeout=120,
                 what="A training at one thread per rank", show=ranks)
        after = pace()
        # All "nodes" share this machine's cores, so only the cores A holds are comparable.
        print(f"\nA: {before[0]} steps/s on {before[1]} cores before B; {after[0]} steps/s on "
              f"{after[1]} cores with B on {NODE} and the peer cap on {other}")
        assert after[1] == 2 and after[0] > 0
        # B ends: both nodes give A every core again.
        wait_for(lambda: not client.job(b).state.holds_cores, timeout=90, what="B done")
        wait_for(lambda: cgroup_cpus(c, NODE, a) == cores and cgroup_cpus(c, other, a) == cores,
                 timeout=20, what="A regrown on both nodes")
    finally:
        stop_then_cancel(client, a, stop)
    wait_for(lambda: not client.job(a).state.holds_cores, timeout=60, what="A ended")


def _sleeper(tmp_path: Path, seconds: int) -> Path:
    s = tmp_path / f"sleep{seconds}.sh"
    s.write_text(f"#!/bin/bash\n#SBATCH --output=/dev/null\nsleep {seconds}\n")
    return s
