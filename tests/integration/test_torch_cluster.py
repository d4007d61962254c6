"""PyTorch DDP across nodes on the real cluster: two workers of an unmodified DDP script
(examples/train_torch_ddp.py: no import of this project; torch 2.13.0 from .venv-torch), one on
each of two nodes with their agents, started by the pytorch-ddp batch template through
malleable-srun (which finds the script's framework by its imports and runs it through
malleable_torch.run, which sets the env:// rendezvous from the step). The job grows into idle
cores, a Prolog takes a node's core back and gives it again, ``scontrol update`` resizes it
1 -> 2 -> 1 -> 2 on both nodes, both workers' threads follow each time, and their weights stay
equal after every epoch."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_plugin.slurm import JobState

from .helpers import (epoch_lines, finish, grow_take_back_and_resize, rank_statuses,
                      submit_two_workers, wait_for, guide_command)

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
TORCH_PY = REPO / ".venv-torch" / "bin" / "python"
TRAIN = REPO / "examples" / "train_torch_ddp.py"


def test_two_ddp_workers_on_two_nodes_train_as_one_and_follow_their_cores(agent_cluster,
                                                                            tmp_path):
    assert TORCH_PY.exists(), "the PyTorch environment is missing: scripts/setup.sh --torch"
    assert "malleable" not in TRAIN.read_text().split('"""', 2)[2]    # no import of ours
    client = agent_cluster.client()
    job = submit_two_workers(agent_cluster, client, tmp_path, guide_command("PyTorch DDP"),
                             TORCH_PY, TRAIN,
                             "--epochs 1000 --steps 10 --width 512")
    job_id, folder, report, stop, show = job.job_id, job.folder, job.report, job.stop, job.show
    try:
        seconds = grow_take_back_and_resize(client, job.env, job_id, folder, tmp_path, show)
        print(f"\nscontrol update -> both DDP workers' threads: "
              f"{', '.join(f'{s * 1000:.0f}' for s in seconds)} ms, "
              f"p50 {sorted(seconds)[len(seconds) // 2] * 1000:.0f} ms")
        wait_for(lambda: all(len(epoch_lines(report, r)) >= 5 for r in (0, 1)), timeout=120,
                 what="five epochs of both workers", show=show)
        # Each worker's optimizer steps counted without a code change (the optimizer's hook).
        # The status record takes a step count when its time window closes, after the epoch's
        # line: on a busy machine the record read at once still had fewer (2026-12-07).
        wait_for(lambda: len(st := rank_statuses(folder)) == 2 and
                 all(s["steps"] >= 50 for s in st.values()), timeout=30,
                 what="both workers' records counting their 50 steps",
                 show=lambda: {r: s["steps"] for r, s in rank_statuses(folder).items()})
        stop.touch()
        assert finish(client, job_id) is JobState.COMPLETED, show()
    finally:
        stop.touch()
        client.cancel(job_id)
    # Every epoch both workers ended with the same weights: the gradients were averaged.
    by_rank = [{e["epoch"]: e for e in epoch_lines(report, r)} for r in (0, 1)]
    common = sorted(set(by_rank[0]) & set(by_rank[1]))
    assert len(common) >= 5, common
    for epoch in common:
        assert by_rank[0][epoch]["weights_sha256"] == by_rank[1][epoch]["weights_sha256"], epoch
    # The script's own view: the threads its training thread ran with changed with the cores.
    seen = {t for r in (0, 1) for e in by_rank[r].values() for t in e["threads"]}
    assert seen == {1, 2}, seen
    rates = {t: [e["samples_per_s"] for r in (0, 1) for e in by_rank[r].values()
                 if e["threads"] == [t]] for t in (1, 2)}
    print(f"{len(common)} epochs, weights equal on both workers after each; samples/s per "
          f"worker at 1 thread {rates[1]}, at 2 {rates[2]}")

