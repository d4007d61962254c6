"""The env:// rendezvous from a Slurm step (malleable_torch.distributed), and torchrun's ranks
read before Slurm's (the runtime's settings): pure, no PyTorch."""
import pytest

from malleable_runtime.allowance import local_rank_and_size
from malleable_runtime.settings import Settings
from malleable_runtime.slurm_step import WorkerPlacementError, port_base
from malleable_torch.distributed import rendezvous_env

ADDR = {"tn1": "10.0.0.1", "tn2": "10.0.0.2"}


def step(rank: int, local: int, node: str, **more) -> dict:
    return {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "tn[1-2]",
            "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURMD_NODENAME": node,
            **more}


def test_an_srun_task_gets_the_rendezvous_of_its_step():
    env = step(3, 1, "tn2")
    added = rendezvous_env(env, ADDR.__getitem__)
    assert added == {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": str(port_base(env)),
                     "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert env["MASTER_ADDR"] == "10.0.0.1"
    # Every task derives the same address and port.
    other = step(0, 0, "tn1")
    rendezvous_env(other, ADDR.__getitem__)
    assert (other["MASTER_ADDR"], other["MASTER_PORT"]) == (env["MASTER_ADDR"], env["MASTER_PORT"])


def test_what_the_user_set_is_kept():
    env = step(1, 1, "tn1", MASTER_PORT="29500", SLURM_STEP_NODELIST="tn1",
               SLURM_STEP_TASKS_PER_NODE="2", SLURM_STEP_NUM_TASKS="2")
    added = rendezvous_env(env, ADDR.__getitem__)
    assert "MASTER_PORT" not in added and env["MASTER_PORT"] == "29500"
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2"


@pytest.mark.parametrize("env", [
    {"TORCHELASTIC_RUN_ID": "x", **step(0, 0, "tn1")},   # torchrun's rendezvous gave them
    {},                                                  # not a Slurm task
])
def test_nothing_is_set_under_torchrun_or_outside_slurm(env):
    before = dict(env)
    assert rendezvous_env(env, ADDR.__getitem__) == {} and env == before


def test_a_task_placed_cyclically_is_refused():
    with pytest.raises(WorkerPlacementError, match="block-wise"):
        rendezvous_env(step(1, 0, "tn2"), ADDR.__getitem__)


def test_torchrun_ranks_come_before_slurms():
    # torchrun under srun: one srun task per node runs the agent; its workers carry Slurm's
    # variables of the agent and torchrun's own.
    env = {**step(1, 0, "tn2", SLURM_STEP_TASKS_PER_NODE="1(x2)"), "TORCHELASTIC_RUN_ID": "j",
           "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4"}
    assert local_rank_and_size(env) == (1, 2)
    s = Settings.from_env(env)
    assert (s.rank, s.local_rank, s.local_size) == (3, 1, 2)
    # RANK and LOCAL_RANK set by something else than torchrun are not taken.
    del env["TORCHELASTIC_RUN_ID"]
    assert local_rank_and_size(env) == (0, 1)
    assert Settings.from_env(env).rank == 1
