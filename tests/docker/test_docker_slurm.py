"""End to end on docker-slurm: separate node containers on Debian's Slurm (22.05 or 24.11),
cores confined by task/cgroup inside them, and the co-scheduler (agents, watcher, Prolog,
job_submit.lua, scontrol update) resizing a malleable TensorFlow job whose threads follow."""
from __future__ import annotations

import functools
import json
import shutil
import time
from pathlib import Path

from malleable_protocol import RunLayout, parse_cpu_list
from sbatch_templates import render

from ..integration.helpers import job_cpus_shell, wait_for

PROGRAM = Path(__file__).parent.parent / "programs" / "train_until.py"
SLURM_OF_SUITE = {"bookworm": "22.05", "trixie": "24.11", "sid": "26.05"}
VENV = "/opt/malleable/venv/bin"
# The ranks' records of a job folder, as JSON (CPU lists as sorted ids), read in a node.
READ_RANKS = """
import glob, json, sys
from malleable_protocol import parse_cpu_list
out = []
for f in sorted(glob.glob(sys.argv[1] + "/rank_*.json")):
    try:
        d = json.load(open(f))
    except (OSError, ValueError):
        continue
    for key in ("allowed_cpus", "share_cpus"):
        d[key] = sorted(parse_cpu_list(d.get(key, "")))
    out.append(d)
print(json.dumps(out))
"""
MALLEABLE = ("/usr/bin/malleable",)     # the command in the node containers (the package's)


def job_cpus(c, node: str, job_id: int, step: str = "") -> frozenset[int] | None:
    """A job's cpuset on ``node``, where the node's discovered layout puts it."""
    try:
        return parse_cpu_list(c.cgroup_layout(node).cpus_file(0, job_id, step or None).read_text())
    except OSError:
        return None


def node_cpus(c, node: str) -> frozenset[int]:
    return parse_cpu_list(c.exec(node, ["cat", "/sys/fs/cgroup/cpuset/cpuset.cpus"]).stdout)


def job_state(c, job_id: int) -> str:
    out = c.ctl("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False)
    return out.stdout.strip() or "GONE"


def submit(c, script: Path, *args: str) -> int:
    out = c.ctl("sbatch", "--parsable", *args, c.to_container(script))
    return int(out.stdout.strip().split(";")[0])


def test_nodes_are_separate_hosts_on_the_suites_slurm(docker_slurm):
    c = docker_slurm
    version = c.ctl("sinfo", "--version").stdout.split()[1]
    assert version.startswith(SLURM_OF_SUITE[c.suite]), version
    states = dict(line.split() for line in
                  c.ctl("sinfo", "-h", "-N", "-o", "%N %T").stdout.splitlines())
    assert states == {n: "idle" for n in c.node_names}
    for node in c.node_names:
        assert c.exec(node, ["hostname"]).stdout.strip() == node
        shown = c.ctl("scontrol", "show", "node", node).stdout
        assert f"NodeHostName={node}" in shown and f"NodeAddr={node}" in shown
        assert f"Version={version}" in shown


def test_each_nodes_feed_comes_over_the_link_into_its_own_container(docker_slurm):
    """No folder of the co-scheduler's is shared: each node's agent keeps its feed in its
    container's own /run/malleable/feed, from the controller's watcher over TCP (munge, each
    container's own munged with the cluster's key)."""
    c = docker_slurm
    for node in c.node_names:
        wait_for(lambda: c.exec(node, ["test", "-s", f"/run/malleable/feed/nodes/{node}.json"],
                                check=False).returncode == 0, timeout=60,
                 what=f"{node}'s feed in its container")
        assert c.exec(c.controller, ["test", "-e", f"/run/malleable/feed/nodes/{node}.json"],
                      check=False).returncode != 0       # not the controller's folder
    log = (c.host_dir / "log" / "watcher.out").read_text()
    assert all(f"link {node} open" in log for node in c.node_names), log[-2000:]


def test_a_jobs_tasks_are_confined_to_its_cores_in_each_node(docker_slurm):
    """task/cgroup inside the node containers: a one-core job's task is held to one CPU by a
    cpuset folder of its own node's Slurm (its discovered layout), whatever the node has."""
    c = docker_slurm
    for node in c.node_names:
        out = c.ctl("srun", "-w", node, "-n1", "-c1", "bash", "-c",
                    "grep Cpus_allowed_list /proc/self/status; grep cpuset /proc/self/cgroup")
        allowed = out.stdout.split("Cpus_allowed_list:")[1].split()[0]
        assert len(parse_cpu_list(allowed)) == 1, out.stdout
        path = out.stdout.split(":cpuset:")[1].split()[0]
        assert c.cgroup_layout(node).job_of(path) is not None, (path, out.stdout)
        assert len(node_cpus(c, node)) >= 2


def test_coscheduler_grows_reclaims_resizes_and_threads_follow(docker_slurm, jobs_dir):
    c = docker_slurm
    node = c.node_names[0]
    all_cpus = node_cpus(c, node)
    shutil.copy(PROGRAM, jobs_dir / PROGRAM.name)
    stop = jobs_dir / "stop"
    script = jobs_dir / "a.sbatch"
    script.write_text(render("single-node", {
        "program": c.to_container(jobs_dir / PROGRAM.name),
        "args": c.to_container(stop), "ntasks": "1", "time": "10",
        "output": c.to_container(jobs_dir / "a.out"), "python": f"{VENV}/python",
        "launcher": f"{VENV}/malleable-srun"}))
    a = submit(c, script, f"-w{node}")
    layout = RunLayout(c.host_dir / "malleable")

    def rank():
        # Read in the node: the job's folder is a tmpfs the node's Prolog mounted there.
        got = c.exec(node, [f"{VENV}/python", "-c", READ_RANKS,
                            c.to_container(layout.job_dir(a))], check=False)
        ranks = json.loads(got.stdout) if got.returncode == 0 else []
        return ranks[0] if ranks else None

    def a_out():
        p = jobs_dir / "a.out"
        return p.read_text()[-1500:] if p.exists() else ""

    try:
        wait_for(lambda: job_state(c, a) == "RUNNING", timeout=60, what="A running")
        shown = c.ctl("scontrol", "show", "job", str(a)).stdout.split()
        assert "AdminComment=malleable:min=1,max=node,weight=1" in shown   # job_submit.lua's
        # A alone on the node: the agent lends it every idle core, and its TF threads follow.
        wait_for(lambda: job_cpus(c, node, a) == all_cpus
                 and job_cpus(c, node, a, "step_0") == all_cpus,
                 timeout=90, what="A grown", show=lambda: (job_cpus(c, node, a), a_out()))
        wait_for(lambda: (st := rank()) and st["intra_active"] == len(all_cpus),
                 timeout=180, what="A's rank at every core", show=lambda: (rank(), a_out()))
        # B arrives: the Prolog takes A's borrowed cores back before B's script starts.
        b_script = jobs_dir / "b.sh"
        cpus_of = functools.partial(job_cpus_shell, node, malleable=MALLEABLE)
        b_script.write_text(
            "#!/bin/bash\n"
            f"echo B={cpus_of('$SLURM_JOB_ID')} A={cpus_of(a)} A_step={cpus_of(a, 'step_0')}\n"
            "sleep 4\n")
        b_out = jobs_dir / "b.out"
        b = submit(c, b_script, "-N1", f"-w{node}", "-n1", f"--output={c.to_container(b_out)}")
        wait_for(lambda: b_out.exists() and "B=" in b_out.read_text(), timeout=60,
                 what="B started")
        fields = dict(kv.split("=") for kv in b_out.read_text().split())
        b_cpus, a_cpus = parse_cpu_list(fields["B"]), parse_cpu_list(fields["A"])
        assert b_cpus and a_cpus and not (b_cpus & a_cpus), fields
        assert not (b_cpus & parse_cpu_list(fields["A_step"])), fields
        wait_for(lambda: (st := rank()) and st["intra_active"] == len(a_cpus),
                 timeout=20, what="A's threads down", show=rank)
        # B ends: A grows back, and so do its threads.
        wait_for(lambda: job_state(c, b) == "GONE" or job_state(c, b) == "COMPLETED",
                 timeout=60, what="B done")
        wait_for(lambda: job_cpus(c, node, a) == all_cpus, timeout=20, what="A grown back")
        wait_for(lambda: (st := rank()) and st["intra_active"] == len(all_cpus),
                 timeout=20, what="A's threads back up", show=rank)
        # A resize asked with scontrol update by the job's owner; a malformed one changes nothing.
        c.ctl("scontrol", "update", f"JobId={a}", "Comment=malleable:cpus=1")
        wait_for(lambda: (cpus := job_cpus(c, node, a)) is not None and len(cpus) == 1,
                 timeout=20, what="A at 1 core")
        wait_for(lambda: (st := rank()) and st["intra_active"] == 1, timeout=20,
                 what="A's rank at 1 thread", show=rank)
        bad = c.ctl("scontrol", "update", f"JobId={a}", "Comment=malleable:cpus=-3", check=False)
        assert bad.returncode != 0
        time.sleep(1.5)
        assert len(job_cpus(c, node, a)) == 1
        # Every resize is in the node's event log.
        events = [json.loads(line) for line in
                  (c.host_dir / "agent" / f"events-{node}.jsonl").read_text().splitlines()]
        mine = [e for e in events if e.get("job") == a]     # node events name no job
        assert len(mine) >= 4, mine
    finally:
        stop.touch()
        time.sleep(1)
        c.ctl("scancel", str(a), check=False)
    wait_for(lambda: job_state(c, a) in ("GONE", "COMPLETED", "CANCELLED"), timeout=60,
             what="A ended")
