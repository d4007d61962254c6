"""Keras 3 across nodes without Horovod: two MultiWorkerMirroredStrategy workers, one on each of
two nodes of the real cluster with its agents, train one model (examples/train_multiworker.py,
TensorFlow 2.21 from .venv-keras3), started by the multi-worker batch template. Their weights stay equal after every epoch; the job grows
into idle cores, a Prolog takes a node's core back and gives it again, and ``scontrol update``
resizes it on both nodes, and both workers' threads follow each time."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from sbatch_templates import render
from slurm_plugin.slurm import JobState

from .helpers import finish, grow_take_back_and_resize, two_workers_view, wait_for

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
KERAS3_PY = REPO / ".venv-keras3" / "bin" / "python"
TRAIN = REPO / "examples" / "train_multiworker.py"


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
    show = two_workers_view(folder, tmp_path / "out")
    try:
        seconds = grow_take_back_and_resize(client, env, job_id, folder, tmp_path, show)
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
        client.cancel(job_id)
    # Every epoch both workers ended with the same weights: the gradients were averaged.
    epochs = sorted(int(p.stem.split("-")[2]) for p in report.glob("weights-0-*.npy"))
    assert len(epochs) >= 5, epochs
    for epoch in epochs:
        a = np.load(report / f"weights-0-{epoch}.npy")
        b = np.load(report / f"weights-1-{epoch}.npy")
        assert a.shape == b.shape and float(np.abs(a - b).max()) <= 1e-6, epoch
    print(f"{len(epochs)} epochs, weights equal on both workers after each")

