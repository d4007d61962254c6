"""The multi-worker cluster from Slurm's environment (malleable_tf.multiworker), pure parts; the
real two-node run is tests/integration/test_multiworker.py."""
from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, strategies as st

from malleable_protocol.hostlist import expand_counts
from malleable_runtime.slurm_step import (PORT_RANGE, WorkerPlacementError, node_address,
                                          port_base, slurm_workers)
from malleable_tf.multiworker import tf_config
from malleable_tf.settings import Settings, Strategy

ADDR = {"an1": "10.0.0.1", "an2": "10.0.0.2", "an3": "10.0.0.3"}


def env(rank, local, node, nodelist="an[1-2]", per_node="1(x2)", tasks=2, **extra):
    """What srun gives task ``rank`` (Slurm 22.05's variable names)."""
    return {"SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": per_node,
            "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURMD_NODENAME": node,
            "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0",
            **extra}


def test_one_worker_per_node_in_node_order():
    w = slurm_workers(env(1, 0, "an2"), ADDR.__getitem__)
    base = port_base(env(1, 0, "an2"))
    assert tf_config(w) == {"cluster": {"worker": [f"10.0.0.1:{base}", f"10.0.0.2:{base + 1}"]},
                             "task": {"type": "worker", "index": 1}}
    assert (w.rank, w.local_rank, w.local_size) == (1, 0, 1)


def test_several_workers_per_node_placed_block_wise():
    e = env(3, 0, "an2", nodelist="an[1-3]", per_node="3,2,1", tasks=6)
    w = slurm_workers(e, ADDR.__getitem__)
    assert [x.node for x in w.workers] == ["an1"] * 3 + ["an2"] * 2 + ["an3"]
    assert (w.rank, w.local_rank, w.local_size) == (3, 0, 2)
    assert len({x.port for x in w.workers}) == 6          # one host may hold them all


@pytest.mark.parametrize("rank, local, node", [
    (1, 0, "an1"),     # cyclic: task 1 on the first node
    (1, 1, "an2"),     # a local id that block placement does not give
])
def test_a_worker_not_placed_block_wise_is_refused(rank, local, node):
    with pytest.raises(WorkerPlacementError, match="block-wise"):
        slurm_workers(env(rank, local, node), ADDR.__getitem__)


@pytest.mark.parametrize("change", [
    {"SLURM_PROCID": ""}, {"SLURM_PROCID": "x"}, {"SLURM_PROCID": "2"},
    {"SLURM_STEP_NUM_TASKS": "3"}, {"SLURM_STEP_TASKS_PER_NODE": "1"},
    {"SLURM_STEP_NODELIST": "an[1-"}, {"SLURM_STEP_NODELIST": ""},
    {"SLURM_STEP_TASKS_PER_NODE": "1(x2"}, {"SLURM_LOCALID": ""},
    {"MALLEABLE_TF_WORKER_PORT": "80"}, {"MALLEABLE_TF_WORKER_PORT": "65535"},
])
def test_a_missing_or_malformed_variable_is_a_clear_error(change):
    e = env(1, 0, "an2")
    e.update(change)
    e = {k: v for k, v in e.items() if v != "" or k == "SLURM_STEP_NODELIST"}
    with pytest.raises(WorkerPlacementError):
        slurm_workers(e, ADDR.__getitem__)


def test_the_port_base_is_given_or_derived_from_the_job_and_step():
    assert port_base({"MALLEABLE_TF_WORKER_PORT": "30000"}) == 30000
    a = port_base({"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0"})
    b = port_base({"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "1"})
    c = port_base({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"})
    assert len({a, b, c}) == 3 and all(PORT_RANGE[0] <= p < PORT_RANGE[1] for p in (a, b, c))
    # Below Linux's ephemeral ports (32768 up by default), a step of 768 tasks included: job 3's
    # base was 38624 when the range reached 40000, and an srun connection held it.
    assert PORT_RANGE[1] + 768 <= 32768


@given(st.text(max_size=30))
def test_counts_never_raise_but_value_error(text):
    try:
        counts = expand_counts(text)
    except ValueError:
        return
    assert counts and all(c >= 0 for c in counts)


def test_counts_as_slurm_writes_them():
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("4") == [4]


def test_a_node_that_does_not_resolve_is_reached_at_its_node_addr():
    def scontrol(argv, **kw):
        assert argv == ["scontrol", "show", "node", "-o", "no-such-node.invalid"]
        return subprocess.CompletedProcess(argv, 0, "NodeName=x Arch=x86_64 NodeAddr=127.0.0.1 "
                                                    "NodeHostName=vm Port=37818\n", "")
    assert node_address("no-such-node.invalid", run=scontrol) == "127.0.0.1"

    def failing(argv, **kw):
        raise subprocess.CalledProcessError(1, argv, "", "Node no-such-node.invalid not found")
    with pytest.raises(WorkerPlacementError, match="does not resolve"):
        node_address("no-such-node.invalid", run=failing)


def test_the_strategy_setting():
    assert Settings.from_env({}).strategy is Strategy.AUTO
    assert Settings.from_env({"MALLEABLE_TF_STRATEGY": "none"}).strategy is Strategy.NONE
    assert Settings.from_env({"MALLEABLE_TF_STRATEGY": "multiworker"}).strategy is \
        Strategy.MULTIWORKER
    with pytest.raises(ValueError, match="MALLEABLE_TF_STRATEGY"):
        Settings.from_env({"MALLEABLE_TF_STRATEGY": "horovod"})


def test_the_runner_makes_the_strategy_for_a_script_that_names_it(tmp_path):
    """An unmodified MultiWorkerMirroredStrategy script needs no setting: the runner reads its
    source (not runs it) and makes the strategy before the script, where it must be made."""
    from malleable_runtime.runner import Program
    from malleable_tf.run import strategy_for
    mw = tmp_path / "mw.py"
    mw.write_text("import tensorflow as tf\nstrategy = tf.distribute.MultiWorkerMirroredStrategy()\n")
    plain = tmp_path / "plain.py"
    plain.write_text("import tensorflow as tf\nmodel = tf.keras.Sequential()\n")
    imported = tmp_path / "imported.py"
    imported.write_text("from tensorflow.distribute import MultiWorkerMirroredStrategy as M\n")
    for script, expected in ((mw, Strategy.MULTIWORKER), (plain, Strategy.NONE),
                             (imported, Strategy.MULTIWORKER),
                             (tmp_path / "missing.py", Strategy.NONE)):
        assert strategy_for(Program(str(script), None, []), Strategy.AUTO) is expected, script
    # What the user set wins; a module run with -m is not read.
    assert strategy_for(Program(str(mw), None, []), Strategy.NONE) is Strategy.NONE
    assert strategy_for(Program(str(plain), None, []), Strategy.MULTIWORKER) is \
        Strategy.MULTIWORKER
    assert strategy_for(Program(None, "pkg.train", []), Strategy.AUTO) is Strategy.NONE
