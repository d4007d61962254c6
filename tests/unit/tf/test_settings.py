"""malleable_tf's settings: every variable read once into ``Settings``; a bad value is one
ValueError that names the variable and what it accepts. No TensorFlow here."""
import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from malleable_protocol.layout import DEFAULT_RUN_DIR
from malleable_tf import Action
from malleable_runtime.control import DEFAULT_RELOAD_SIGNAL
from malleable_runtime.session import settings_from_env
from malleable_tf.settings import (AllowanceSource, NativeBuild, NativeVariant, OneDnn, Pinning,
                                   Settings, Split)

ROOT = Path(__file__).resolve().parents[3]
RTMIN = int(signal.SIGRTMIN)


def test_an_empty_environment_gives_the_defaults():
    s = Settings.from_env({})
    assert s == Settings()
    assert DEFAULT_RELOAD_SIGNAL == RTMIN + 3
    assert s.signals == {RTMIN + 3: Action.RELOAD}
    assert (s.max_threads, s.follow, s.count_steps, s.log, s.status, s.target) == \
        (None, True, True, True, None, None)
    assert (s.allowance, s.pin, s.split, s.onednn) == \
        (AllowanceSource.AUTO, Pinning.SHARE, Split.ACTIVE, OneDnn.INLINE)
    assert s.native == NativeBuild(NativeVariant.AUTO, ())
    assert (s.rank, s.local_rank, s.local_size, s.job_id, s.step, s.node, s.run_dir) == \
        (0, 0, 1, None, "step_batch", "", DEFAULT_RUN_DIR)


def test_settings_cannot_be_changed_after_the_read():
    s = Settings.from_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.follow = False
    with pytest.raises(TypeError):
        s.signals[signal.SIGUSR2] = Action.RELOAD


def test_split_is_the_adapters_enum():
    from malleable_tf.pools import Split as PoolsSplit
    assert PoolsSplit is Split


@pytest.mark.parametrize("env,read", [
    ({"MALLEABLE_TF_MAX_THREADS": "8"}, {"max_threads": 8}),
    ({"MALLEABLE_TF_MAX_THREADS": "4096"}, {"max_threads": 4096}),
    ({"MALLEABLE_TF_MAX_THREADS": "node"}, {"max_threads": os.cpu_count()}),
    ({"MALLEABLE_TF_MAX_THREADS": ""}, {"max_threads": None}),
    ({"MALLEABLE_TF_FOLLOW": "0"}, {"follow": False}),
    ({"MALLEABLE_TF_FOLLOW": "off"}, {"follow": False}),
    ({"MALLEABLE_TF_FOLLOW": "False"}, {"follow": False}),   # was True: only "0" meant off
    ({"MALLEABLE_TF_FOLLOW": "1"}, {"follow": True}),
    ({"MALLEABLE_TF_FOLLOW": " yes "}, {"follow": True}),
    ({"MALLEABLE_TF_COUNT_STEPS": "0"}, {"count_steps": False}),
    ({"MALLEABLE_TF_COUNT_STEPS": "on"}, {"count_steps": True}),
    ({"MALLEABLE_TF_LOG": "0"}, {"log": False}),
    ({"MALLEABLE_TF_LOG": "true"}, {"log": True}),
    ({"MALLEABLE_TF_SIGNALS": "USR1=reload, SIGUSR2=intra-down"},
     {"signals": {signal.SIGUSR1: Action.RELOAD, signal.SIGUSR2: Action.INTRA_DOWN}}),
    ({"MALLEABLE_TF_SIGNALS": "RTMIN+3=reload,URG=intra-up"},
     {"signals": {RTMIN + 3: Action.RELOAD, signal.SIGURG: Action.INTRA_UP}}),
    ({"MALLEABLE_TF_SIGNALS": "sigrtmax-2=inter-up,rtmin=inter-down"},
     {"signals": {signal.SIGRTMAX - 2: Action.INTER_UP, RTMIN: Action.INTER_DOWN}}),
    ({"MALLEABLE_TF_SIGNALS": ""}, {"signals": {RTMIN + 3: Action.RELOAD}}),
    ({"MALLEABLE_TF_SIGNALS": ","}, {"signals": {}}),
    ({"MALLEABLE_TF_STATUS": "/s/rank_{rank}.{step}.json"},
     {"status": "/s/rank_{rank}.{step}.json"}),
    ({"MALLEABLE_TF_STATUS": "/s/{job}-{node}-{pid}-{local_rank:03d}.json"},
     {"status": "/s/{job}-{node}-{pid}-{local_rank:03d}.json"}),
    ({"MALLEABLE_TF_STATUS": ""}, {"status": ""}),            # set empty: no record
    ({"MALLEABLE_TF_TARGET": "/t/job_5.{node}.json"}, {"target": "/t/job_5.{node}.json"}),
    ({"MALLEABLE_TF_TARGET": ""}, {"target": None}),
    ({"MALLEABLE_TF_ALLOWANCE": "cgroup"}, {"allowance": AllowanceSource.CGROUP}),
    ({"MALLEABLE_TF_ALLOWANCE": "auto"}, {"allowance": AllowanceSource.AUTO}),
    ({"MALLEABLE_TF_PIN": "allowance"}, {"pin": Pinning.ALLOWANCE}),
    ({"MALLEABLE_TF_SPLIT": "eigen"}, {"split": Split.EIGEN}),
    ({"MALLEABLE_TF_SPLIT": "pool"}, {"split": Split.POOL}),
    ({"MALLEABLE_TF_ONEDNN": "off"}, {"onednn": OneDnn.OFF}),
    ({"MALLEABLE_TF_NATIVE": "parking-only"},
     {"native": NativeBuild(NativeVariant.PARKING_ONLY)}),
    ({"MALLEABLE_TF_CXXFLAGS": "-I/opt/tf/include -DX='a b'"},
     {"native": NativeBuild(cxxflags=("-I/opt/tf/include", "-DX=a b"))}),
    ({"SLURM_PROCID": "5"}, {"rank": 5}),
    ({"OMPI_COMM_WORLD_RANK": "7", "SLURM_PROCID": "5"}, {"rank": 7}),
    ({"HOROVOD_RANK": "3"}, {"rank": 3}),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
     {"local_rank": 1, "local_size": 2}),
    ({"HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "4"}, {"local_rank": 0, "local_size": 4}),
    ({"SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "2"},
     {"local_rank": 1, "local_size": 2}),
    ({"SLURM_JOB_ID": "42"}, {"job_id": 42}),
    ({"SLURM_JOB_ID": "4294967295"}, {"job_id": 2**32 - 1}),
    ({"SLURM_STEP_ID": "0"}, {"step": "step_0"}),
    ({"SLURM_STEP_ID": str(0xfffffffc)}, {"step": "step_extern"}),
    ({"SLURM_STEP_ID": ""}, {"step": "step_batch"}),
    ({"SLURMD_NODENAME": "n1"}, {"node": "n1"}),
    ({"MALLEABLE_RUN_DIR": "/tmp/m"}, {"run_dir": Path("/tmp/m")}),
    ({"MALLEABLE_RUN_DIR": ""}, {"run_dir": DEFAULT_RUN_DIR}),
])
def test_each_variable(env, read):
    s = Settings.from_env(env)
    assert {name: getattr(s, name) for name in read} == read
    # Every other setting keeps its default.
    assert dataclasses.replace(s, **{n: getattr(Settings(), n) for n in read}) == Settings()


@pytest.mark.parametrize("env,named,accepted", [
    ({"MALLEABLE_TF_MAX_THREADS": "0"}, "MALLEABLE_TF_MAX_THREADS", "1..4096 or 'node'"),
    ({"MALLEABLE_TF_MAX_THREADS": "4097"}, "MALLEABLE_TF_MAX_THREADS", "1..4096 or 'node'"),
    ({"MALLEABLE_TF_MAX_THREADS": "-1"}, "MALLEABLE_TF_MAX_THREADS", "1..4096 or 'node'"),
    ({"MALLEABLE_TF_MAX_THREADS": "Node"}, "MALLEABLE_TF_MAX_THREADS", "1..4096 or 'node'"),
    ({"MALLEABLE_TF_MAX_THREADS": "²"}, "MALLEABLE_TF_MAX_THREADS", "1..4096 or 'node'"),
    ({"MALLEABLE_TF_MAX_THREADS": "9" * 5000}, "MALLEABLE_TF_MAX_THREADS", "1..4096"),
    ({"MALLEABLE_TF_FOLLOW": "maybe"}, "MALLEABLE_TF_FOLLOW", "1 or 0"),
    ({"MALLEABLE_TF_COUNT_STEPS": "2"}, "MALLEABLE_TF_COUNT_STEPS", "1 or 0"),
    ({"MALLEABLE_TF_LOG": "quiet"}, "MALLEABLE_TF_LOG", "1 or 0"),
    ({"MALLEABLE_TF_SIGNALS": "USR1"}, "MALLEABLE_TF_SIGNALS", "NAME=action"),
    ({"MALLEABLE_TF_SIGNALS": "NOPE=reload"}, "MALLEABLE_TF_SIGNALS", "not a signal"),
    ({"MALLEABLE_TF_SIGNALS": "USR1=explode"}, "MALLEABLE_TF_SIGNALS",
     "reload, intra-up, intra-down, inter-up, inter-down"),
    ({"MALLEABLE_TF_SIGNALS": "KILL=reload"}, "MALLEABLE_TF_SIGNALS", "cannot be a control"),
    ({"MALLEABLE_TF_SIGNALS": "RTMIN+99=reload"}, "MALLEABLE_TF_SIGNALS", "RTMIN+0..RTMIN+"),
    ({"MALLEABLE_TF_SIGNALS": "RTMIN-1=reload"}, "MALLEABLE_TF_SIGNALS", "RTMIN+n or RTMAX-n"),
    ({"MALLEABLE_TF_SIGNALS": "37=reload"}, "MALLEABLE_TF_SIGNALS", "not a signal"),
    ({"MALLEABLE_TF_STATUS": "/s/{rnak}.json"}, "MALLEABLE_TF_STATUS", "{rank}, {local_rank}"),
    ({"MALLEABLE_TF_STATUS": "/s/{rank.json"}, "MALLEABLE_TF_STATUS", "{rank}, {local_rank}"),
    ({"MALLEABLE_TF_TARGET": "/t/{}.json"}, "MALLEABLE_TF_TARGET", "{node}, {step}"),
    ({"MALLEABLE_TF_ALLOWANCE": "mask"}, "MALLEABLE_TF_ALLOWANCE", "auto or cgroup"),
    ({"MALLEABLE_TF_PIN": "both"}, "MALLEABLE_TF_PIN", "share or allowance"),
    ({"MALLEABLE_TF_SPLIT": "sideways"}, "MALLEABLE_TF_SPLIT", "active, eigen or pool"),
    ({"MALLEABLE_TF_ONEDNN": "on"}, "MALLEABLE_TF_ONEDNN", "inline or off"),
    ({"MALLEABLE_TF_NATIVE": "full"}, "MALLEABLE_TF_NATIVE", "auto or parking-only"),
    ({"MALLEABLE_TF_CXXFLAGS": "-DX='a"}, "MALLEABLE_TF_CXXFLAGS", "compiler flags"),
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID", "a number >= 0"),
    ({"OMPI_COMM_WORLD_RANK": "-1"}, "OMPI_COMM_WORLD_RANK", "a number >= 0"),
    ({"HOROVOD_RANK": "1.0"}, "HOROVOD_RANK", "a number >= 0"),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "one", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
     "OMPI_COMM_WORLD_LOCAL_RANK", "a number >= 0"),
    ({"HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "٣"}, "HOROVOD_LOCAL_SIZE", "a number"),
    ({"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "2(x)"}, "SLURM_STEP_TASKS_PER_NODE",
     "2(x3),1"),
    ({"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": "a"},
     "SLURM_NODEID", "a number >= 0"),
    ({"SLURM_LOCALID": "x", "SLURM_STEP_TASKS_PER_NODE": "2"}, "SLURM_LOCALID", "a number"),
    ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID", "1..4294967295"),
    ({"SLURM_JOB_ID": "0"}, "SLURM_JOB_ID", "1..4294967295"),
    ({"SLURM_JOB_ID": "4294967296"}, "SLURM_JOB_ID", "1..4294967295"),
    ({"SLURM_STEP_ID": "x"}, "SLURM_STEP_ID", "a step id"),
    ({"SLURM_STEP_ID": "٣"}, "SLURM_STEP_ID", "a step id"),
])
def test_a_bad_value_is_one_error_naming_the_variable_and_what_it_takes(env, named, accepted):
    with pytest.raises(ValueError) as info:
        Settings.from_env(env)
    message = str(info.value)
    assert message.startswith(named + " ") and accepted in message, message
    assert len(message) < 400 and info.value.__cause__ is None


def test_the_first_bad_variable_is_named_whatever_the_others_hold():
    with pytest.raises(ValueError, match="^MALLEABLE_TF_PIN"):
        Settings.from_env({"MALLEABLE_TF_PIN": "x", "MALLEABLE_TF_FOLLOW": "0",
                           "MALLEABLE_TF_SIGNALS": "USR2=reload"})


# --- init() and the package: where the settings are read --------------------------------------

@pytest.fixture
def clean_env(monkeypatch):
    """The variables init() reads, unset for the test and as they were after it (even those the
    code under test sets itself)."""
    for key in [k for k in os.environ if k.startswith(("MALLEABLE_", "SLURM_", "OMPI_",
                                                        "HOROVOD_"))]:
        monkeypatch.delenv(key)
    for key in ("MALLEABLE_TF_STATUS", "MALLEABLE_TF_TARGET", "MALLEABLE_TF_ALLOWANCE",
                "MALLEABLE_TF_MAX_THREADS"):
        monkeypatch.setenv(key, "")      # recorded as unset: removed again after the test
        monkeypatch.delenv(key)
    return monkeypatch


def test_in_a_co_scheduled_job_a_rank_takes_what_malleable_srun_would_set(clean_env, tmp_path):
    (tmp_path / "jobs" / "job_42").mkdir(parents=True)
    clean_env.setenv("SLURM_JOB_ID", "42")
    clean_env.setenv("MALLEABLE_RUN_DIR", str(tmp_path))
    clean_env.setenv("MALLEABLE_TF_ALLOWANCE", "auto")     # the user's own setting wins
    s = settings_from_env(Settings.from_env)
    assert s.status == str(tmp_path / "jobs" / "job_42" / "rank_{rank}.{step}.json")
    assert s.target == str(tmp_path / "targets" / "job_42.{node}.json")
    assert s.max_threads == os.cpu_count() and s.allowance is AllowanceSource.AUTO
    assert os.environ["MALLEABLE_TF_STATUS"] == s.status    # what it starts sees them too


@pytest.mark.parametrize("env", [{"SLURM_JOB_ID": "43"},                 # no folder for it
                                 {"SLURM_JOB_ID": "42", "MALLEABLE_TF_STATUS": ""},
                                 {}])
def test_outside_a_co_scheduled_job_nothing_is_assumed(clean_env, tmp_path, env):
    (tmp_path / "jobs" / "job_42").mkdir(parents=True)
    clean_env.setenv("MALLEABLE_RUN_DIR", str(tmp_path))
    for key, value in env.items():
        clean_env.setenv(key, value)
    s = settings_from_env(Settings.from_env)
    assert s.target is None and s.max_threads is None and "MALLEABLE_TF_TARGET" not in os.environ


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLEABLE_TF_")}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=60)


def test_a_bad_setting_stops_init_before_tensorflow_is_imported():
    done = run_python("import sys, malleable_tf\n"
                      "try:\n    malleable_tf.init()\n"
                      "except ValueError as e:\n    print(e, '|', 'tensorflow' in sys.modules)\n",
                      MALLEABLE_TF_SPLIT="sideways")
    assert done.stdout.strip() == \
        "MALLEABLE_TF_SPLIT must be active, eigen or pool, not 'sideways' | False", done.stderr


def test_the_default_reload_signal_before_init_does_not_end_the_process():
    """A real-time signal's default action ends the process: importing the package ignores
    the configured signals until init() installs the handler."""
    # SIG_DFL first: this test process ignores it (it imported malleable_tf), and its children
    # inherit that.
    code = ("import os, signal, time\n"
            f"signal.signal({DEFAULT_RELOAD_SIGNAL}, signal.SIG_DFL)\n"
            "import malleable_tf\n"
            f"os.kill(os.getpid(), {DEFAULT_RELOAD_SIGNAL}); time.sleep(0.1); print('alive')\n")
    assert run_python(code).stdout == "alive\n"
    # Not configured, it is not ignored: the process ends by it, as any program would.
    done = run_python(code, MALLEABLE_TF_SIGNALS="USR2=reload")
    assert done.returncode == -DEFAULT_RELOAD_SIGNAL and done.stdout == ""
