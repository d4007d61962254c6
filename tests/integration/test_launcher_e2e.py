"""A 2-node, 2-ranks-per-node Horovod job submitted with the user guide's command for a Horovod
script (malleable-sbatch, the multi-node template, malleable-srun), resized twice with scontrol
update; and a SIGTERM checkpoint resumed after requeue."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sbatch_templates import render
from slurm_plugin.slurm import JobState

from .helpers import guide_command, rank_statuses, stop_then_cancel, submit_as_written, wait_for

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
HVD_TRAIN = REPO / "tests" / "programs" / "hvd_train.py"
LAUNCHER = str(Path(sys.executable).with_name("malleable-srun"))


def ranks(cluster, job_id: int) -> dict[int, dict]:
    return rank_statuses(cluster.run_layout.job_dir(job_id))


def test_two_nodes_two_ranks_each_resized_twice(agent_cluster, tmp_path):
    c = agent_cluster
    tmp_path.chmod(0o755)
    stop = tmp_path / "stop"
    # The user guide's command for a Horovod script, as written there.
    job_id = submit_as_written(c, tmp_path, guide_command("Horovod"), Path(sys.executable),
                               HVD_TRAIN, {"args": f"{stop} 1000000",
                                           "output": f"{tmp_path}/out"}, [])
    client = c.client()
    env = {**os.environ, **c.env()}
    cores = os.cpu_count()
    try:
        wait_for(lambda: len(st := ranks(c, job_id)) == 4 and
                 all("1" in s["steps_per_s"] for s in st.values()), timeout=240,
                 what="4 ranks training", show=lambda: ranks(c, job_id))
        st = ranks(c, job_id)
        # malleable-srun gave each rank a pool of the node's cores; two ranks per node split it.
        assert all(s["intra_pool"] == cores and s["local_size"] == 2 for s in st.values()), st
        for node in {s["node"] for s in st.values()}:
            shares = [tuple(s["share_cpus"]) for s in st.values() if s["node"] == node]
            assert len(shares) == 2 and not set(shares[0]) & set(shares[1]), st
        # Resize 1: one core per node. Both ranks of a node now share it, one thread each.
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "Comment=malleable:cpus=1"],
                       check=True, env=env, capture_output=True)
        wait_for(lambda: all(len(s["allowed_cpus"]) == 1 and s["intra_active"] == 1
                             for s in ranks(c, job_id).values()), timeout=10,
                 what="every rank on one core", show=lambda: ranks(c, job_id))
        # Resize 2: back to every core of the node; the two ranks split them again.
        subprocess.run(["scontrol", "update", f"JobId={job_id}",
                        f"Comment=malleable:cpus={cores}"], check=True, env=env,
                       capture_output=True)
        wait_for(lambda: all(len(s["allowed_cpus"]) == cores and
                             len(s["share_cpus"]) == cores // 2
                             for s in ranks(c, job_id).values()), timeout=10,
                 what="every rank on its share again", show=lambda: ranks(c, job_id))
        assert all(s["resizes"] >= 1 for s in ranks(c, job_id).values())
        stop.touch()
        job = wait_for(lambda: (lambda j: j if not j.state.holds_cores and
                                j.state is not JobState.PENDING else None)(client.job(job_id)),
                       timeout=120, what="job end")
        out = (tmp_path / "out").read_text()
        assert job.state is JobState.COMPLETED, out[-3000:]
        lines = [line for line in out.splitlines() if line.startswith("rank ")]
        assert len(lines) == 4, out[-3000:]
        for line in lines:
            f = line.split()
            assert float(f[f.index("last_loss") + 1]) < float(f[f.index("first_loss") + 1]), line
        # Its timeline from the agents' event logs (malleable timeline): on each node, its
        # allocation, one core, all of them again, then its end (written once the job ended).
        per_node = wait_for(lambda: (lambda t: t if len(t) == 2 and
                                     all(v[-1] == 0 for v in t.values()) else None)(
                                         timeline_of(c, job_id, tmp_path)),
                            timeout=60, what="the job's end in its timeline",
                            show=lambda: timeline_of(c, job_id, tmp_path))
        for node, counts in per_node.items():
            changes = [n for i, n in enumerate(counts) if i == 0 or n != counts[i - 1]]
            assert changes == [cores, 1, cores, 0], (node, counts)
    finally:
        stop.touch()
        time.sleep(1)
        client.cancel(job_id)


def timeline_of(c, job_id: int, tmp_path) -> dict[str, list[int]]:
    """``malleable timeline JOB --json`` from every node's event log: the job's cores at each
    sample, per node."""
    out = tmp_path / "timeline.json"
    logs = sorted((c.paths.root / "agent").glob("events-*.jsonl"))
    done = subprocess.run([sys.executable, "-m", "slurm_plugin.commands.main", "timeline",
                           str(job_id), "--json", str(out), "--events", *map(str, logs)],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return {}
    per_node: dict[str, list[int]] = {}
    for sample in json.loads(out.read_text()):
        if sample["job"] == job_id:
            per_node.setdefault(sample["node"], []).append(sample["cores"])
    return per_node


def test_sigterm_checkpoint_and_requeue_resume(agent_cluster, tmp_path):
    c = agent_cluster
    tmp_path.chmod(0o777)
    script = tmp_path / "train.sbatch"
    script.write_text(render("single-node", {
        "program": str(REPO / "examples" / "train_digits.py"), "ntasks": "1", "time": "10",
        "args": f"--epochs 100000 --checkpoint-dir {tmp_path}/ckpt",
        "output": f"{tmp_path}/out-%j.txt", "python": sys.executable,
        "launcher": LAUNCHER}))
    client = c.client()
    job_id = client.submit(script, ["--open-mode=append"])   # the requeued run appends
    env = {**os.environ, **c.env()}
    out = tmp_path / f"out-{job_id}.txt"
    try:
        wait_for(lambda: out.exists() and out.read_text().count("epoch") >= 3, timeout=240,
                 what="a few epochs", show=lambda: out.read_text()[-2000:] if out.exists() else "")
        # What preemption or the time limit does: SIGTERM to the ranks.
        subprocess.run(["scancel", "--signal=TERM", str(job_id)], check=True, env=env)
        wait_for(lambda: "checkpoint saved at epoch" in out.read_text(), timeout=60,
                 what="checkpoint", show=lambda: out.read_text()[-2000:])
        saved = json.loads((tmp_path / "ckpt" / "state.json").read_text())["epoch"]
        wait_for(lambda: not client.job(job_id).state.holds_cores, timeout=60, what="stopped")
        subprocess.run(["scontrol", "requeue", str(job_id)], check=True, env=env)
        wait_for(lambda: f"resuming from the checkpoint of epoch {saved}" in out.read_text(),
                 timeout=240, what="resume", show=lambda: out.read_text()[-2000:])
    finally:
        client.cancel(job_id)


def status_rows(env: dict, job_id: int) -> list[dict] | str:
    """``malleable status --json`` (the real command), this job's rows; its error while it
    fails (on a fresh cluster, until the watcher has published the feed)."""
    out = subprocess.run([sys.executable, "-m", "slurm_plugin.commands.main", "status", "--json"],
                         capture_output=True, text=True, timeout=60, env=env)
    if out.returncode != 0:
        return out.stderr
    return [r for r in json.loads(out.stdout) if r["job_id"] == job_id]


def test_a_custom_training_loop_shows_its_steps_per_s_in_malleable_status(agent_cluster,
                                                                          tmp_path):
    """Horovod's DistributedGradientTape in a tf.function: no Keras fit, no callback, no
    malleable_tf.step(). The optimizer's apply_gradients counts each step (an op in the graph),
    and `malleable status` shows the job's steps/s."""
    c, node = agent_cluster, "an1"
    tmp_path.chmod(0o777)
    stop = tmp_path / "stop"
    env = {**os.environ, **c.env()}
    job_id = int(subprocess.run(
        ["sbatch", "--parsable", "-N1", "-n1", "-c1", f"-w{node}",
         "--comment=malleable:min=1,max=2", f"-o{tmp_path}/out", "--wrap",
         f"exec {LAUNCHER} {sys.executable} {REPO}/tests/programs/hvd_tape.py {stop}"],
        check=True, env=env, capture_output=True, text=True).stdout.split(";")[0])
    try:
        rows = wait_for(lambda: isinstance(r := status_rows(env, job_id), list) and r and
                        r[0]["steps_per_s"] and
                        all(v > 0 for v in r[0]["steps_per_s"]) and r,
                        timeout=180, what="steps/s in malleable status",
                        show=lambda: status_rows(env, job_id))
        print(rows)
        assert rows[0]["node"] == node and rows[0]["threads"], rows
        table = subprocess.run([sys.executable, "-m", "slurm_plugin.commands.main", "status"],
                               capture_output=True, text=True, timeout=60, env=env).stdout
        print(table)
        line = next(x for x in table.splitlines() if x.split()[:1] == [str(job_id)])
        assert line.split()[-1] != "-", table     # the STEPS/S column has a number
    finally:
        stop_then_cancel(c.client(), job_id, stop)
