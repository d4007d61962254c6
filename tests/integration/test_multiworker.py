"""Keras 3 across nodes without Horovod: two MultiWorkerMirroredStrategy workers, one on each of
two nodes of the real cluster with its agents, train one model (examples/train_multiworker.py,
TensorFlow 2.21 from .venv-keras3), started by the multi-worker batch template. Their weights stay equal after every epoch; the job grows
into idle cores, a Prolog takes a node's core back and gives it again, and ``scontrol update``
resizes it on both nodes, and both workers' threads follow each time."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from slurm_plugin.slurm import JobState

from .helpers import (epoch_lines, finish, grow_take_back_and_resize, resize_seconds,
                      submit_two_workers, two_workers_threads, wait_for, guide_command)

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
KERAS3_PY = REPO / ".venv-keras3" / "bin" / "python"
TRAIN = REPO / "examples" / "train_multiworker.py"
# The user guide's form for a script that builds its strategy with malleable_tf.multiworker.
MULTI_WORKER = ["malleable-sbatch", "multi-worker", "--set", "program=train.py"]
UNMODIFIED = REPO / "examples" / "train_multiworker_unmodified.py"   # no import of this project


def test_two_keras3_workers_on_two_nodes_train_as_one_and_follow_their_cores(agent_cluster,
                                                                               tmp_path):
    assert KERAS3_PY.exists(), "the Keras 3 environment is missing: scripts/setup.sh --keras3"
    client = agent_cluster.client()
    # The batch template, through malleable-srun and the runner (which makes the strategy).
    job = submit_two_workers(agent_cluster, client, tmp_path, MULTI_WORKER, KERAS3_PY, TRAIN,
                             "--epochs 1000 --steps 10 --width 512")
    job_id, folder, report, stop, show = job.job_id, job.folder, job.report, job.stop, job.show
    try:
        seconds = grow_take_back_and_resize(client, job.env, job_id, folder, tmp_path, show)
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


def test_an_unmodified_multiworker_script_needs_no_setting(agent_cluster, tmp_path):
    """A MultiWorkerMirroredStrategy script as TensorFlow's tutorials write it (no import of
    this project), through the plain multi-node template (no MALLEABLE_TF_STRATEGY): the runner
    sees the strategy in its source and makes it first, so it does not stop with "Collective ops
    must be configured at program startup"; both workers train with equal weights and follow
    ``scontrol update``."""
    assert KERAS3_PY.exists(), "the Keras 3 environment is missing: scripts/setup.sh --keras3"
    assert "malleable" not in UNMODIFIED.read_text().split('"""', 2)[2]
    client = agent_cluster.client()
    job = submit_two_workers(agent_cluster, client, tmp_path,
                             guide_command("Keras 3 across nodes"), KERAS3_PY,
                             UNMODIFIED, "--epochs 1000")
    assert "MALLEABLE_TF_STRATEGY" not in (tmp_path / "job.sh").read_text()
    job_id, folder, report, stop, show = job.job_id, job.folder, job.report, job.stop, job.show
    try:
        wait_for(lambda: two_workers_threads(folder) == {0: 2, 1: 2}, timeout=180,
                 what="both workers at 2 threads", show=show)
        seconds = resize_seconds(job.env, job_id, folder, 1)
        print(f"\nscontrol update cpus=1 -> both unmodified workers' threads: "
              f"{seconds * 1000:.0f} ms")
        wait_for(lambda: all(len(epoch_lines(report, r)) >= 3 for r in (0, 1)), timeout=120,
                 what="three epochs of both workers", show=show)
        stop.touch()
        assert finish(client, job_id) is JobState.COMPLETED, show()
    finally:
        stop.touch()
        client.cancel(job_id)
    by_rank = [{e["epoch"]: e["weights_sha256"] for e in epoch_lines(report, r)} for r in (0, 1)]
    common = sorted(set(by_rank[0]) & set(by_rank[1]))
    assert len(common) >= 3 and all(by_rank[0][e] == by_rank[1][e] for e in common), by_rank
