"""Keras 3 across nodes without Horovod: two MultiWorkerMirroredStrategy workers, one on each of
two nodes of the real cluster with its agents, train one model (examples/train_multiworker.py,
TensorFlow 2.21 from .venv-keras3), started by the multi-worker batch template. Their weights stay equal after every epoch; the job grows
into idle cores, a Prolog takes a node's core back and gives it again, and ``scontrol update``
resizes it on both nodes, and both workers' threads follow each time."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from sbatch_templates import render
from slurm_plugin.slurm import JobState

from .helpers import finish, rank_statuses, wait_for

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
KERAS3_PY = REPO / ".venv-keras3" / "bin" / "python"
TRAIN = REPO / "examples" / "train_multiworker.py"


def threads(folder: Path) -> dict[int, int] | None:
    """Each worker's active intra-op threads, once both have a status record."""
    st = rank_statuses(folder)
    return {r: d["intra_active"] for r, d in st.items()} if len(st) == 2 else None


def resize_seconds(env, job_id: int, folder: Path, cpus: int) -> float:
    """``scontrol update`` to ``cpus`` per node, then the seconds until both workers' status
    records show that many threads (polled every 10 ms)."""
    t0 = time.monotonic()
    subprocess.run(["scontrol", "update", f"JobId={job_id}", f"Comment=malleable:cpus={cpus}"],
                   check=True, env=env, capture_output=True)
    deadline = t0 + 20
    while time.monotonic() < deadline:
        if threads(folder) == {0: cpus, 1: cpus}:
            return time.monotonic() - t0
        time.sleep(0.01)
    raise AssertionError(f"workers at {threads(folder)} 20 s after cpus={cpus}")


def test_two_keras3_workers_on_two_nodes_train_as_one_and_follow_their_cores(agent_cluster,
                                                                               tmp_path):
    assert KERAS3_PY.exists(), "the Keras 3 environment is missing: scripts/setup.sh --keras3"
    c = agent_cluster
    client = c.client()
    env = {**os.environ, **c.env()}
    tmp_path.chmod(0o777)
    report, stop = tmp_path / "report", tmp_path / "stop"
    # The batch template, through malleable-srun and the runner (which makes the strategy).
    script = tmp_path / "job.sh"
    script.write_text(render("multi-worker", {
        "python": str(KERAS3_PY), "launcher": str(KERAS3_PY.parent / "malleable-srun"),
        "program": str(TRAIN), "min_cpus": "1", "max_cpus": "2", "output": f"{tmp_path}/out",
        "args": f"--epochs 1000 --steps 10 --width 512 --report {report} --until {stop}"}))
    job_id = client.submit(script, ["-c1", "-w", "an1,an2"])
    folder = c.run_layout.job_dir(job_id)
    other = None

    def show():
        return f"{threads(folder)}; job output: {(tmp_path / 'out').read_text()[-2000:]}" \
            if (tmp_path / "out").exists() else str(threads(folder))
    try:
        # Lend-idle grows the job into each node's idle core: both workers run 2 threads.
        wait_for(lambda: threads(folder) == {0: 2, 1: 2}, timeout=180,
                 what="both workers at 2 threads", show=show)
        # A job on an2 takes its core back (its Prolog): the worker there drops to 1, and the
        # job, sized as one across its nodes, to 1 on an1 too; the core is given again after.
        other = client.submit(_sleeper(tmp_path),
                              ["-N1", "-c1", "-w", "an2", f"-o{tmp_path}/other"])
        wait_for(lambda: threads(folder) == {0: 1, 1: 1}, timeout=60,
                 what="both workers at 1 thread after another job took an2's core", show=show)
        client.cancel(other)
        wait_for(lambda: threads(folder) == {0: 2, 1: 2}, timeout=60,
                 what="both workers at 2 threads again", show=show)
        # scontrol update resizes the job on both nodes.
        seconds = []
        for cpus in (1, 2, 1, 2):
            seconds.append(resize_seconds(env, job_id, folder, cpus))
        print(f"\nscontrol update -> both workers' threads: "
              f"{', '.join(f'{s * 1000:.0f}' for s in seconds)} ms, "
              f"p50 {float(np.median(seconds)) * 1000:.0f} ms")
        # Five epochs before the stop, for the weights' check below: how many the steps above
        # span depends on the machine's pace (a slow CI run stopped the job after three).
        wait_for(lambda: all(len(list(report.glob(f"weights-{rank}-*.npy"))) >= 5
                             for rank in (0, 1)), timeout=120,
                 what="five epochs of both workers", show=show)
        stop.touch()
        assert finish(client, job_id) is JobState.COMPLETED, show()
    finally:
        stop.touch()
        for j in (job_id, other):
            if j is not None:
                client.cancel(j)
    # Every epoch both workers ended with the same weights: the gradients were averaged.
    epochs = sorted(int(p.stem.split("-")[2]) for p in report.glob("weights-0-*.npy"))
    assert len(epochs) >= 5, epochs
    for epoch in epochs:
        a = np.load(report / f"weights-0-{epoch}.npy")
        b = np.load(report / f"weights-1-{epoch}.npy")
        assert a.shape == b.shape and float(np.abs(a - b).max()) <= 1e-6, epoch
    print(f"{len(epochs)} epochs, weights equal on both workers after each")


def _sleeper(tmp_path: Path) -> Path:
    script = tmp_path / "sleep.sh"
    script.write_text("#!/bin/bash\nsleep 600\n")
    return script
