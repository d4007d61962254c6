"""Every job grows, whatever way it runs (the SPANK plugin and the step fence): training in the
batch step, sequential and concurrent sruns in a job that has grown, salloc then srun. Real
Slurm, real cgroups, real TensorFlow; each node of the cluster has 2 CPUs."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_plugin.cluster import daemons
from slurm_plugin.feed.store import FeedStore
from slurm_plugin.slurm import JobState

from .helpers import cgroup_cpus, finish, step_records as records, timeline, wait_for
from .invariants import violations

pytestmark = pytest.mark.cluster
TRAIN = Path(__file__).parent.parent / "programs" / "train_until.py"


def training_job(c, node: str, tmp_path: Path) -> tuple[int, Path]:
    """A malleable job (1 core, may grow to 2) training in its batch step until ``stop``."""
    tmp_path.chmod(0o777)
    stop = tmp_path / "stop"
    job_id = int(subprocess.run(
        ["sbatch", "--parsable", "-N1", "-c1", f"-w{node}", "--comment=malleable:min=1,max=2",
         f"-o{tmp_path}/out", "--wrap", f"exec {sys.executable} {TRAIN} {stop}"],
        check=True, env={**os.environ, **c.env()}, capture_output=True,
        text=True).stdout.split(";")[0])
    return job_id, stop


def test_training_in_the_batch_step_grows_and_shrinks(agent_cluster, tmp_path):
    """``sbatch -c1 --wrap "python train.py"``: no malleable-srun, no srun."""
    c, node = agent_cluster, "an1"
    client = c.client()
    env = {**os.environ, **c.env()}
    job_id, stop = training_job(c, node, tmp_path)
    seen = []
    try:
        # The node's other core is idle: the job and its threads grow to 2.
        wait_for(lambda: (r := records(c, job_id).get("step_batch")) and
                 r["allowed"] == {0, 1} and r["intra_active"] == 2 and r["steps"] > 0,
                 timeout=120, what="the batch step grown to 2 cores, 2 threads",
                 show=lambda: timeline(c, node, job_id))
        seen += timeline(c, node, job_id)
        assert cgroup_cpus(c, node, job_id) == cgroup_cpus(c, node, job_id, "step_batch") == {0, 1}
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "Comment=malleable:cpus=1"],
                       check=True, env=env, capture_output=True)
        wait_for(lambda: (r := records(c, job_id)["step_batch"]) and len(r["allowed"]) == 1 and
                 r["intra_active"] == 1, timeout=10, what="shrunk to 1 core, 1 thread",
                 show=lambda: timeline(c, node, job_id))
        seen += timeline(c, node, job_id)
        # The agent narrows the rank's folders first and the job's last.
        wait_for(lambda: len(cgroup_cpus(c, node, job_id) or ()) == 1, timeout=5,
                 what="the job folder at 1 core", show=lambda: timeline(c, node, job_id))
        assert not violations(c, node), violations(c, node)
        stop.touch()
        assert finish(client, job_id) is JobState.COMPLETED, (tmp_path / "out").read_text()[-2000:]
        assert "trained" in (tmp_path / "out").read_text()
    finally:
        stop.touch()
        client.cancel(job_id)
    print("\n".join(seen))


def test_sequential_and_concurrent_sruns_launch_in_a_grown_job(agent_cluster, tmp_path):
    """Before the SPANK plugin, a second step in a job that held more than its allocation failed
    to launch (slurmstepd's reset of the job folder: EBUSY)."""
    c, node = agent_cluster, "an1"
    tmp_path.chmod(0o777)
    go, stop, out = tmp_path / "go", tmp_path / "stop", tmp_path / "out"
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
while [ ! -e {go} ]; do sleep 0.1; done
for i in 1 2 3; do srun -n1 true; echo "sequential $i rc=$?"; done
srun --overlap -n1 {sys.executable} {TRAIN} {stop} &
srun --overlap -n1 {sys.executable} {TRAIN} {stop} &
wait
echo "all steps done"
""")
    client = c.client()
    job_id = client.submit(script, ["-N1", "-c1", f"-w{node}", "--comment=malleable:min=1,max=2",
                                    f"-o{out}"])
    try:
        wait_for(lambda: cgroup_cpus(c, node, job_id) == {0, 1}, timeout=60,
                 what="the job grown to the node's 2 cores")
        go.touch()
        # Two concurrent steps with a rank each: each step's folder gets its own core, and
        # each rank runs one thread on it; the job keeps both cores.
        wait_for(lambda: len(st := records(c, job_id)) == 2 and
                 all(len(r["allowed"]) == 1 and r["intra_active"] == 1 and r["steps"] > 0
                     for r in st.values()), timeout=120,
                 what="two concurrent steps training, one core each",
                 show=lambda: (timeline(c, node, job_id), out.read_text()[-1500:]))
        st = records(c, job_id)
        (a, ra), (b, rb) = sorted(st.items())
        assert a != b and not ra["allowed"] & rb["allowed"], st
        assert cgroup_cpus(c, node, job_id, a) == ra["allowed"]
        assert cgroup_cpus(c, node, job_id, b) == rb["allowed"]
        assert cgroup_cpus(c, node, job_id) == {0, 1}
        assert not violations(c, node), violations(c, node)
        text = out.read_text()
        assert all(f"sequential {i} rc=0" in text for i in (1, 2, 3)), text[-2000:]
        stop.touch()
        assert finish(client, job_id) is JobState.COMPLETED, out.read_text()[-2000:]
        assert "all steps done" in out.read_text()
    finally:
        go.touch()
        stop.touch()
        client.cancel(job_id)


def test_salloc_then_srun_grows_and_a_second_srun_joins(agent_cluster, tmp_path):
    c, node = agent_cluster, "an2"
    tmp_path.chmod(0o777)
    stop, stop2 = tmp_path / "stop", tmp_path / "stop2"
    env = {**os.environ, **c.env()}
    salloc = subprocess.Popen(
        ["salloc", "-N1", "-c1", f"-w{node}", "--comment=malleable:min=1,max=2",
         "srun", "-n1", sys.executable, str(TRAIN), str(stop)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    second = None
    try:
        job_id = wait_for(lambda: next((j.job_id for j in c.client().jobs(node=node)
                                        if j.state.holds_cores), None),
                          timeout=60, what="salloc's job")
        wait_for(lambda: (r := records(c, job_id).get("step_0")) and r["allowed"] == {0, 1} and
                 r["intra_active"] == 2, timeout=120, what="salloc's srun grown to 2 threads",
                 show=lambda: timeline(c, node, job_id))
        # A second srun into the grown allocation (as from another terminal).
        second = subprocess.Popen(["srun", f"--jobid={job_id}", "--overlap", "-n1",
                                   sys.executable, str(TRAIN), str(stop2)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for(lambda: len(st := records(c, job_id)) == 2 and
                 all(len(r["allowed"]) == 1 and r["intra_active"] == 1 and r["steps"] > 0
                     for r in st.values()) and
                 not st["step_0"]["allowed"] & st["step_1"]["allowed"], timeout=120,
                 what="two steps, one core each", show=lambda: timeline(c, node, job_id))
        assert cgroup_cpus(c, node, job_id) == {0, 1}
        assert not violations(c, node), violations(c, node)
        # The second step ends first: salloc's end would take the allocation from under it.
        stop2.touch()
        assert second.wait(60) == 0, second.stdout.read()[-2000:]
        stop.touch()
        assert salloc.wait(60) == 0, salloc.stdout.read()[-2000:]
    finally:
        stop2.touch()
        stop.touch()
        for p in (salloc, second):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(30)


def test_a_step_that_cannot_be_made_safe_does_not_start(agent_cluster, tmp_path):
    """Fail closed: while something that is not the node's agent holds the node's lock, the
    step-start hook cannot fence the job; the SPANK plugin then refuses the step (slurmd's log
    says why) and the job goes on; the next step starts once the lock is free."""
    c, node = agent_cluster, "an2"
    config = c.agent_config(node)
    tmp_path.chmod(0o777)
    go1, go2, out = tmp_path / "go1", tmp_path / "go2", tmp_path / "out"
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
while [ ! -e {go1} ]; do sleep 0.1; done
srun -n1 touch {tmp_path}/ran-locked; echo "locked rc=$?"
while [ ! -e {go2} ]; do sleep 0.1; done
srun -n1 touch {tmp_path}/ran-free; echo "free rc=$?"
""")
    client = c.client()
    job_id = client.submit(script, ["-N1", "-c1", f"-w{node}",
                                    "--comment=malleable:min=1,max=2", f"-o{out}"])
    holder = None
    try:
        wait_for(lambda: cgroup_cpus(c, node, job_id) is not None, timeout=60, what="job running")
        # flock's child (sleep) holds the lock too: the whole group is killed below.
        holder = subprocess.Popen(["flock", str(config.lock_file), "sleep", "120"],
                                  start_new_session=True)
        wait_for(lambda: holder.pid and _holds_lock(config.lock_file), timeout=10,
                 what="the lock taken")
        go1.touch()
        wait_for(lambda: out.exists() and "locked rc=" in out.read_text(), timeout=60,
                 what="the first srun")
        # srun says so (and exits 0 all the same, Slurm 22.05); the task never ran.
        assert "launch failed: Plugin initialization failed" in out.read_text()
        assert not (tmp_path / "ran-locked").exists()
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(10)
        go2.touch()
        assert finish(client, job_id) is JobState.COMPLETED, out.read_text()[-2000:]
        assert "free rc=0" in out.read_text() and (tmp_path / "ran-free").exists(), \
            out.read_text()[-2000:]
        log = (config.state_dir / f"hooks-{node}.log").read_text()
        assert f"job {job_id} step_0 start: NOT SAFE to start" in log, log[-2000:]
        assert not violations(c, node), violations(c, node)
    finally:
        if holder is not None:
            try:
                os.killpg(holder.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        go1.touch()
        go2.touch()
        client.cancel(job_id)


def _holds_lock(path: Path) -> bool:
    from slurm_plugin.node.procs import lock_holder
    return lock_holder(path) is not None


def test_each_step_start_takes_the_path_its_job_needs(agent_cluster, tmp_path):
    """A rigid job's steps start with no process started (the plugin finds the gate the agent
    left and writes a fence, in C: nothing in the hooks log); a grown job's step is brought
    back by the running agent on its socket ("(agent)"); with that agent gone, by the Python
    hook ("(hook)"). Every step launches, and the grown job grows again after each."""
    c = agent_cluster
    rigid_node, grown_node = "an1", "an2"
    config = c.agent_config(grown_node)
    tmp_path.chmod(0o777)
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
for i in 1 2 3; do
  while [ ! -e {tmp_path}/go.$SLURM_JOB_ID.$i ]; do sleep 0.05; done
  srun -n1 true; echo "step $i rc=$?"
done
""")
    client = c.client()
    rigid = client.submit(script, ["-N1", "-c1", f"-w{rigid_node}", f"-o{tmp_path}/rigid.out"])
    grown = client.submit(script, ["-N1", "-c1", f"-w{grown_node}",
                                   "--comment=malleable:min=1,max=2", f"-o{tmp_path}/grown.out"])
    hooks_log = {n: dataclasses.replace(config, node=n).state_dir / f"hooks-{n}.log"
                 for n in (rigid_node, grown_node)}

    def lines(node, job_id):
        log = hooks_log[node]
        text = log.read_text() if log.exists() else ""
        return [x for x in text.splitlines() if f"job {job_id} step_" in x]

    def step(job_id, i, out):
        (tmp_path / f"go.{job_id}.{i}").touch()
        wait_for(lambda: f"step {i} rc=" in out.read_text(), timeout=90,
                 what=f"job {job_id} step {i}", show=lambda: out.read_text()[-1500:])
        assert f"step {i} rc=0" in out.read_text(), out.read_text()[-1500:]

    try:
        wait_for(lambda: cgroup_cpus(c, grown_node, grown) == {0, 1}, timeout=60,
                 what="the malleable job grown to 2 cores")
        wait_for(lambda: cgroup_cpus(c, rigid_node, rigid) is not None, timeout=60,
                 what="the rigid job running")
        for i in (1, 2, 3):
            step(rigid, i, tmp_path / "rigid.out")
        assert lines(rigid_node, rigid) == []          # no hook ran: decided in C

        def events():
            log, hooks = config.event_log, hooks_log[grown_node]
            return (cgroup_cpus(c, grown_node, grown),
                    log.read_text().splitlines()[-6:] if log.exists() else [],
                    hooks.read_text().splitlines()[-6:] if hooks.exists() else [])

        def grown_again():
            wait_for(lambda: cgroup_cpus(c, grown_node, grown) == {0, 1}, timeout=30,
                     what="grown again", show=events)
        grown_again()
        step(grown, 1, tmp_path / "grown.out")
        got = lines(grown_node, grown)
        assert got and got[-1].endswith("(agent)") and "resizes in" in got[-1], got
        grown_again()        # by the agent, once the step's slurmstepd is set up
        agent = next(r for r in c.records() if r.name == f"agent {grown_node}")
        os.kill(agent.pid, signal.SIGTERM)
        wait_for(lambda: not config.step_socket.exists(), timeout=20,
                 what="the agent gone (its socket removed)")
        daemons.reap_children()
        step(grown, 2, tmp_path / "grown.out")
        got = lines(grown_node, grown)
        # No agent: the job stayed grown, and the Python hook brought it back.
        assert got[-1].endswith("(hook)") and "resizes in" in got[-1], got
        c.restart_agent(grown_node)
        step(grown, 3, tmp_path / "grown.out")
        assert not violations(c, grown_node) and not violations(c, rigid_node)
        assert finish(client, rigid) is JobState.COMPLETED
        assert finish(client, grown) is JobState.COMPLETED
    finally:
        for job_id in (rigid, grown):
            for i in (1, 2, 3):
                (tmp_path / f"go.{job_id}.{i}").touch()
            client.cancel(job_id)
        c.restart_agent(grown_node)      # stops the recorded one first if it still runs


def test_borrowed_core_seconds_match_the_cgroup_timeline(agent_cluster, tmp_path):
    """The job-usage line the Epilog writes: its borrowed core-seconds match, within 2%, the
    integral of (the job folder's width - its allocation) sampled from the real cgroup every
    10 ms, for a job that grows into the idle core, is asked down to 1 core and ends."""
    import json
    import threading
    import time
    c, node = agent_cluster, "an1"
    config = c.agent_config(node)
    tmp_path.chmod(0o777)
    go = tmp_path / "go"
    client = c.client()
    env = {**os.environ, **c.env()}
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nwhile [ ! -e {go} ]; do sleep 0.05; done\n")
    job_id = client.submit(script, ["-N1", "-c1", f"-w{node}", "--malleable=1:2",
                                    f"-o{tmp_path}/out"])
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample():
        while not done.is_set():
            cpus = cgroup_cpus(c, node, job_id)
            if cpus is not None:
                samples.append((time.time(), len(cpus)))
            time.sleep(0.01)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        wait_for(lambda: cgroup_cpus(c, node, job_id) == {0, 1}, timeout=60,
                 what="the job grown to 2 cores")
        time.sleep(4)
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "Comment=malleable:cpus=1"],
                       check=True, env=env, capture_output=True)
        wait_for(lambda: len(cgroup_cpus(c, node, job_id) or ()) == 1, timeout=20,
                 what="the job back at 1 core")
        time.sleep(1)
        done.set()
        sampler.join(5)
        go.touch()
        assert finish(client, job_id) is JobState.COMPLETED
        # The samples' integral: each width held until the next sample.
        sampled = sum((t1 - t0) * (w0 - 1) for (t0, w0), (t1, _) in zip(samples, samples[1:]))

        def line():
            for raw in config.event_log.read_text().splitlines():
                e = json.loads(raw)
                if e.get("event") == "job-usage" and e.get("job") == job_id:
                    return e
        usage = wait_for(line, timeout=30, what="the job's job-usage line")
        assert sampled > 3.0, samples[:5]
        assert usage["lent_core_s"] == 0 and usage["allocation"] == 1, usage
        assert abs(usage["borrowed_core_s"] - sampled) <= 0.02 * sampled, (usage, sampled)
        print(f"\nborrowed: job-usage {usage['borrowed_core_s']:.3f} core-s, "
              f"cgroup timeline {sampled:.3f} core-s")
        # And in Slurm's accounting: the watcher sums the nodes' usage once the job has ended
        # everywhere and writes it into the job's SystemComment (slurmdbd, MariaDB).
        want = (f"malleable:borrowed_core_s={usage['borrowed_core_s']:.3f},"
                f"lent_core_s=0.000,nodes=1")

        def in_sacct():
            out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", str(job_id), "-o",
                                  "JobID,State,SystemComment"], env=env, capture_output=True,
                                 text=True, check=True).stdout.strip()
            return out if out.endswith(want) else None
        row = wait_for(in_sacct, timeout=40, what=f"sacct showing {want}")
        assert row == f"{job_id}|COMPLETED|{want}", row
        store = FeedStore(config.watcher_feed_dir)

        def closed():
            """The job's lines in usage.jsonl once its nodes' files are gone: the watcher
            writes the comment, then the line, then removes the files."""
            lines = store.usage_log.read_text().splitlines() if store.usage_log.exists() else []
            mine = [e for e in map(json.loads, lines) if e["job"] == job_id]
            return mine if mine and job_id not in store.usage_files() else None
        mine = wait_for(closed, timeout=10, what="the job's usage.jsonl line, its files removed",
                        show=lambda: (store.usage_files(), store.usage_log.exists() and
                                      store.usage_log.read_text()[-800:]))
        assert len(mine) == 1 and mine[0]["sacct"] is True, mine
        assert mine[0]["nodes"][node]["borrowed_core_s"] == usage["borrowed_core_s"], mine
        print(f"sacct: {row}")
    finally:
        done.set()
        go.touch()
        client.cancel(job_id)


def test_a_rigid_job_pays_nothing_with_every_agent_and_the_watcher_stopped(agent_cluster,
                                                                            tmp_path):
    """Issue 40: jobs that did not ask for malleability pay nothing for it, not when the
    co-scheduler is down. With both nodes' agents and the watcher stopped (the feed going
    stale), a rigid job starts (its Prolog runs the cycle itself, or, on a quiet node, exits
    in its shell), its three steps launch with no process started for them (nothing of theirs
    in the hooks log: the plugin decided in C), it completes, and no node drains. The agents
    and the watcher are started again."""
    c, node = agent_cluster, "an1"
    config = c.agent_config(node)
    hooks_log = config.state_dir / f"hooks-{node}.log"
    tmp_path.chmod(0o777)
    script = tmp_path / "rigid.sh"
    script.write_text("#!/bin/bash\nfor i in 1 2 3; do srun -n1 true; echo \"step $i rc=$?\"; "
                      "done\n")
    client = c.client()
    c.stop_daemons(["watcher"] + [f"agent {n}" for n in ("an1", "an2")])
    try:
        wait_for(lambda: not config.step_socket.exists(), timeout=20,
                 what="the agent gone (its socket removed)")
        quiet = config.quiet_file.exists()       # no agent left to change it
        rigid = client.submit(script, ["-N1", "-c1", f"-w{node}", f"-o{tmp_path}/rigid.out"])
        assert finish(client, rigid) is JobState.COMPLETED, \
            (tmp_path / "rigid.out").read_text()[-1500:]
        out = (tmp_path / "rigid.out").read_text()
        assert [f"step {i} rc=0" in out for i in (1, 2, 3)] == [True] * 3, out
        logged = hooks_log.read_text().splitlines() if hooks_log.exists() else []
        assert any(f"prolog job {rigid}:" in x for x in logged) is not quiet, logged[-5:]
        print(f"\nnode {node} {'quiet: the Prolog skipped Python' if quiet else 'not quiet'}")
        assert not [x for x in logged if f"job {rigid} step_" in x], logged[-5:]
        for n in client.nodes():
            assert "DRAIN" not in n.state_flags and not n.state.startswith("drain"), n
    finally:
        c.restart_watcher()
        for n in ("an1", "an2"):
            c.restart_agent(n)
    wait_for(lambda: config.step_socket.exists(), timeout=60, what="the agent back")


def test_the_kill_switch_returns_every_job_to_its_allocation_in_one_cycle(agent_cluster,
                                                                          tmp_path):
    """Issue 40, the site's kill switch: a malleable job grown to both cores of its node;
    ``malleable disable`` returns when its cycle is done, and the job holds exactly its one
    core then (its rank down to one thread), and keeps it while the agent runs on.
    ``malleable enable``: the agent grows it again."""
    import time
    c, node = agent_cluster, "an1"
    client = c.client()
    job_id, stop = training_job(c, node, tmp_path)
    switch = [sys.executable, "-m", "slurm_plugin.commands.main"]
    where = ["--config", str(c.hooks_dir / "agent.json"), "--node", node]
    try:
        wait_for(lambda: (r := records(c, job_id).get("step_batch")) and
                 r["allowed"] == {0, 1} and r["intra_active"] == 2, timeout=120,
                 what="grown to 2 cores, 2 threads", show=lambda: timeline(c, node, job_id))
        t0 = time.monotonic()
        off = subprocess.run([*switch, "disable", *where, "--reason", "test"],
                             capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        assert off.returncode == 0, off.stderr
        assert len(cgroup_cpus(c, node, job_id)) == 1, off.stdout      # already, on return
        print(f"\n{off.stdout.strip()} ({took:.2f} s with the command's start)")
        wait_for(lambda: records(c, job_id)["step_batch"]["intra_active"] == 1, timeout=10,
                 what="its rank at one thread", show=lambda: timeline(c, node, job_id))
        time.sleep(3)          # the agent's cycles go on: it stays there
        assert len(cgroup_cpus(c, node, job_id)) == 1
        assert not violations(c, node), violations(c, node)
        config = c.agent_config(node)
        events = [json.loads(x) for x in config.event_log.read_text().splitlines()]
        assert any(e["event"] == "switched-off" and "test" in e["error"] for e in events)
        on = subprocess.run([*switch, "enable", *where], capture_output=True, text=True,
                            timeout=60)
        assert on.returncode == 0, on.stderr
        wait_for(lambda: cgroup_cpus(c, node, job_id) == {0, 1}, timeout=30,
                 what="grown again", show=lambda: timeline(c, node, job_id))
        # For the whole site at once, from where the feed is: through the watcher and every
        # node's feed; the command returns once every node's agent reports the hold.
        t0 = time.monotonic()
        off = subprocess.run([*switch, "disable", "--site", *where, "--reason", "site test"],
                             capture_output=True, text=True, timeout=90)
        took = time.monotonic() - t0
        assert off.returncode == 0, off.stdout + off.stderr
        assert f"{len(c.spec.node_names)} node(s) hold every job" in off.stdout, off.stdout
        assert len(cgroup_cpus(c, node, job_id)) == 1, off.stdout
        print(f"{off.stdout.strip()} ({took:.2f} s with the command's start)")
        time.sleep(3)
        assert len(cgroup_cpus(c, node, job_id)) == 1 and not violations(c, node)
        on = subprocess.run([*switch, "enable", "--site", *where], capture_output=True,
                            text=True, timeout=90)
        assert on.returncode == 0, on.stdout + on.stderr
        wait_for(lambda: cgroup_cpus(c, node, job_id) == {0, 1}, timeout=30,
                 what="grown again after the site's switch", show=lambda: timeline(c, node, job_id))
    finally:
        subprocess.run([*switch, "enable", *where], capture_output=True, timeout=60)
        subprocess.run([*switch, "enable", "--site", *where, "--wait", "0"], capture_output=True,
                       timeout=60)
        stop.touch()
        client.cancel(job_id)


def test_a_quiet_node_starts_rigid_jobs_without_python_and_lends_after_a_fresh_poll(
        agent_cluster, tmp_path):
    """Issue 40, jobs that did not ask pay nothing: on a node with no malleable job and
    nothing lent (its quiet file), a rigid job's Prolog exits in its shell (no line of the
    Python Prolog in the hooks log) and the job runs. A malleable job then ends the quiet: the
    agent lends nothing until the watcher has published a poll made after that (a rigid job
    started meanwhile without a Prolog is in it), then grows the job; no core is in two jobs.
    When it has ended, the node is quiet again."""
    import time
    c, node = agent_cluster, "an2"
    client = c.client()
    env = {**os.environ, **c.env()}
    config = c.agent_config(node)
    hooks_log = config.state_dir / f"hooks-{node}.log"
    wait_for(config.quiet_file.exists, timeout=60, what=f"{node} quiet",
             show=lambda: timeline(c, node, 0))
    tmp_path.chmod(0o777)
    rigid = int(subprocess.run(
        ["sbatch", "--parsable", "-N1", "-c1", f"-w{node}", f"-o{tmp_path}/rigid",
         "--wrap", "grep Cpus_allowed_list /proc/self/status"], check=True, env=env,
        capture_output=True, text=True).stdout.split(";")[0])
    assert finish(client, rigid) is JobState.COMPLETED
    assert "Cpus_allowed_list" in (tmp_path / "rigid").read_text()
    logged = hooks_log.read_text() if hooks_log.exists() else ""
    assert f"prolog job {rigid}:" not in logged, logged[-1000:]
    assert config.quiet_file.exists()
    job_id, stop = training_job(c, node, tmp_path)
    try:
        wait_for(lambda: client.job(job_id).state is JobState.RUNNING, timeout=60,
                 what="the malleable job running")
        started = time.monotonic()
        wait_for(lambda: cgroup_cpus(c, node, job_id) == {0, 1}, timeout=60,
                 what="grown after the gate opened", show=lambda: timeline(c, node, job_id))
        grew_after = time.monotonic() - started
        assert not config.quiet_file.exists() and not config.loud_file.exists()
        assert not violations(c, node), violations(c, node)
        events = [json.loads(x) for x in config.event_log.read_text().splitlines()]
        held = [e for e in events if e["event"] == "feed-catching-up"]
        print(f"\nrigid job {rigid} started without the Python Prolog; the malleable job grew "
              f"{grew_after:.1f} s after it ran ({len(held)} hold event(s) while the feed "
              "caught up)")
        assert f"prolog job {job_id}:" in hooks_log.read_text()     # a sign: the full Prolog
    finally:
        stop.touch()
        client.cancel(job_id)
    finish(client, job_id)
    wait_for(config.quiet_file.exists, timeout=60, what=f"{node} quiet again",
             show=lambda: timeline(c, node, job_id))
