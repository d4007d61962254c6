"""malleable_torch on real PyTorch (torch 2.13.0, .venv-torch), each case in its own process:
the training thread's intra-op count follows taskset, a cpuset cgroup, signals and the
co-scheduler's target; unmodified scripts run through the runner with their optimizer steps
counted; DDP on gloo under torchrun and from a Slurm step's environment, replicas equal."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from malleable_protocol import Target

pytestmark = pytest.mark.torch

PROGRAMS = Path(__file__).parent.parent / "programs"


def clean_env(**more: str) -> dict:
    """This process's environment without a launcher's or Slurm's variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "SLURM_", "HOROVOD_", "MALLEABLE_", "TORCHELASTIC_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                         "MASTER_PORT", "OMP_NUM_THREADS")}
    return {**env, **more}


class Follower:
    """tests/programs/torch_follow.py, read line by line."""

    def __init__(self, tmp: Path, *args: str, env: dict | None = None, recheck: str = "30"):
        self.stop = tmp / "stop"
        self.proc = subprocess.Popen(
            [sys.executable, str(PROGRAMS / "torch_follow.py"), "2", recheck, str(self.stop),
             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env or clean_env())
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "READY", line + self.proc.stderr.read()[-3000:]

    def wait_state(self, pred, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("STATE "):
                s = json.loads(line[6:])
                seen.append(s)
                if pred(s):
                    return s
        raise AssertionError(f"state not reached: {seen[-5:]} {self.proc.stderr.read()[-2000:]}"
                             if self.proc.poll() is not None else f"state not reached: {seen[-5:]}")

    def close(self) -> None:
        self.stop.touch()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.communicate()


def test_the_training_thread_follows_taskset_from_outside(tmp_path):
    f = Follower(tmp_path)
    try:
        first = f.wait_state(lambda s: s["intra"] == 2 and s["torch"] == 2)
        subprocess.run(["taskset", "-a", "-p", "-c", "1", str(f.proc.pid)], check=True,
                       capture_output=True)
        s = f.wait_state(lambda s: s["torch"] == 1)
        # torch.get_num_threads() in the training thread: the count its next op runs with.
        assert s["intra"] == 1 and s["allowed"] == [1] and s["share"] == [1], s
        assert s["poll_wakes"] > first["poll_wakes"], (first, s)   # the poll saw it (no recheck)
        subprocess.run(["taskset", "-a", "-p", "-c", "0,1", str(f.proc.pid)], check=True,
                       capture_output=True)
        s = f.wait_state(lambda s: s["torch"] == 2)
        assert s["intra"] == 2 and s["allowed"] == [0, 1], s
    finally:
        f.close()


def test_the_training_thread_follows_a_cpuset_cgroup(tmp_path, cpuset_cgroup):
    f = Follower(tmp_path, str(cpuset_cgroup))
    try:
        f.wait_state(lambda s: s["torch"] == 2)
        (cpuset_cgroup / "cpuset.cpus").write_text("0")
        s = f.wait_state(lambda s: s["torch"] == 1)
        assert s["intra"] == 1 and s["allowed"] == [0], s
        (cpuset_cgroup / "cpuset.cpus").write_text("0-1")
        s = f.wait_state(lambda s: s["torch"] == 2)
        assert s["allowed"] == [0, 1], s
    finally:
        f.close()


def test_signals_and_the_coschedulers_target(tmp_path):
    target = tmp_path / "target.json"
    env = clean_env(MALLEABLE_TF_SIGNALS="RTMIN+3=reload,USR2=intra-down,USR1=intra-up",
                    MALLEABLE_TF_TARGET=str(target))
    f = Follower(tmp_path, env=env)
    try:
        f.wait_state(lambda s: s["torch"] == 2)
        f.proc.send_signal(signal.SIGUSR2)
        assert f.wait_state(lambda s: s["torch"] == 1)["intra"] == 1
        f.proc.send_signal(signal.SIGUSR1)
        assert f.wait_state(lambda s: s["torch"] == 2)["intra"] == 2
        # The co-scheduler holds one core for the job here: the reload signal applies it.
        target.write_bytes(Target(cpus=frozenset({1}), generation=1).encode())
        f.proc.send_signal(signal.SIGRTMIN + 3)
        s = f.wait_state(lambda s: s["torch"] == 1)
        assert s["share"] == [1], s
    finally:
        f.close()


def test_at_one_thread_it_uses_the_cores_plain_pytorch_uses_at_one(tmp_path):
    """The count is not only reported: the process's CPU use at 1 follows plain PyTorch's at 1,
    measured in the same test (a plain process started with OMP_NUM_THREADS=1, then =2)."""
    def plain(n: int) -> float:
        code = ("import time, torch; a = torch.randn(384, 384); t = time.monotonic()\n"
                "while time.monotonic() - t < 0.3: a @ a\n"
                "t, c = time.monotonic(), time.process_time()\n"
                "while time.monotonic() - t < 1.5: a @ a\n"
                "print((time.process_time() - c) / (time.monotonic() - t))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=clean_env(OMP_NUM_THREADS=str(n)), check=True).stdout
        return float(out)

    plain1, plain2 = plain(1), plain(2)
    assert plain2 > plain1 + 0.4, (plain1, plain2)      # the measure tells 1 from 2
    f = Follower(tmp_path, env=clean_env(REPORT_CPU="1",
                                         MALLEABLE_TF_SIGNALS="USR2=intra-down"))
    try:
        f.wait_state(lambda s: s["torch"] == 2)
        f.proc.send_signal(signal.SIGUSR2)
        f.wait_state(lambda s: s["torch"] == 1)
        rates = []
        while len(rates) < 3:     # three windows after the first full one at 1 thread
            line = f.proc.stdout.readline()
            if line.startswith("CPU "):
                rates.append(json.loads(line[4:])["cpu"])
        got = sorted(rates[1:])[0]
        print("cpu/s plain 1:", plain1, "plain 2:", plain2, "malleable at 1:", rates)
        assert got < (plain1 + plain2) / 2, (plain1, plain2, rates)
    finally:
        f.close()


def result_lines(text: str) -> list[dict]:
    """Every "RESULT {json}" in ``text``: two workers printing at once (torchrun passes both
    to one stdout) may put two on one line."""
    decoder, out, at = json.JSONDecoder(), [], text.find("RESULT ")
    while at >= 0:
        value, end = decoder.raw_decode(text, at + len("RESULT "))
        out.append(value)
        at = text.find("RESULT ", end)
    return out


def run_train(tmp_path: Path, *args: str, runner: bool = True, env: dict | None = None,
              prefix: tuple[str, ...] = (), timeout: float = 300
              ) -> tuple[subprocess.CompletedProcess, dict, dict]:
    status = tmp_path / "status.json"
    cmd = [*prefix, sys.executable, *(["-m", "malleable_torch.run"] if runner else []),
           str(PROGRAMS / "torch_train.py"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**clean_env(MALLEABLE_TF_STATUS=str(status)), **(env or {})})
    result = next((json.loads(line[7:]) for line in proc.stdout.splitlines()
                   if line.startswith("RESULT ")), None)
    assert result is not None, proc.stderr[-3000:]
    return proc, result, json.loads(status.read_text()) if status.exists() else {}


def test_an_unmodified_script_runs_through_the_runner_with_its_steps_counted(tmp_path):
    text = (PROGRAMS / "torch_train.py").read_text()
    # Its one import of the project is under --init-self, which this test does not give.
    assert [line for line in text.splitlines() if "import malleable" in line] == \
        ["    import malleable_torch"]
    proc, result, status = run_train(tmp_path, "--steps", "40", "--exit", "3", "a b")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert result["name"] == "__main__" and result["argv"][1:] == ["--steps", "40", "--exit",
                                                                   "3", "a b"]
    # Every optimizer step counted once, with no code change; the threads the node allows.
    assert status["steps"] == 40 and status["intra_active"] == 2, status
    assert result["threads"] == [2], result


def test_a_script_that_calls_init_itself_joins_the_runners(tmp_path):
    proc, result, status = run_train(tmp_path, "--steps", "5", "--init-self")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert status["steps"] == 5, status


def test_training_in_a_thread_of_its_own_gets_the_count_at_its_optimizer_step(tmp_path):
    # One core allowed: the count (1) must reach the thread that trains, not only main.
    proc, result, status = run_train(tmp_path, "--steps", "20", "--thread",
                                     env={"MALLEABLE_TF_MAX_THREADS": "2", "OMP_NUM_THREADS": "2"},
                                     prefix=("taskset", "-c", "0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The thread started at OMP_NUM_THREADS=2; from its first optimizer step on it runs 1.
    assert result["threads"] == [1], result
    assert status["steps"] == 20


def test_ddp_under_torchrun_each_worker_takes_its_share(tmp_path):
    status = tmp_path / "status-{rank}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "malleable_torch.run", str(PROGRAMS / "torch_train.py"), "--steps", "30"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=clean_env(MALLEABLE_TF_STATUS=str(status)))
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = sorted(result_lines(proc.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1] and all(r["world"] == 2 for r in results)
    # torchrun started each worker with OMP_NUM_THREADS=1; each now runs its share of the
    # node's 2 cores: 1 thread, on its own core.
    assert all(r["threads"] == [1] for r in results), results
    assert results[0]["checksum"] == results[1]["checksum"], results
    records = [json.loads(Path(str(status).format(rank=r)).read_text()) for r in (0, 1)]
    assert [(s["local_rank"], s["local_size"]) for s in records] == [(0, 2), (1, 2)]
    assert records[0]["share_cpus"] != records[1]["share_cpus"]
    assert all(s["steps"] == 30 for s in records), records


def test_ddp_from_a_slurm_steps_environment(tmp_path):
    """Two tasks as srun starts them on one node (its variables, no srun here: the real
    cluster's test is tests/integration/test_torch_cluster.py): the runner makes the env://
    rendezvous, the unmodified script's init_process_group("gloo") joins, replicas equal."""
    status = tmp_path / "status-{rank}.json"
    step = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "localhost",
            "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NUM_TASKS": "2",
            "SLURMD_NODENAME": "localhost", "SLURM_NODEID": "0",
            "MALLEABLE_TF_STATUS": str(status)}
    procs = [subprocess.Popen([sys.executable, "-m", "malleable_torch.run",
                               str(PROGRAMS / "torch_train.py"), "--steps", "30"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=clean_env(**step, SLURM_PROCID=str(r), SLURM_LOCALID=str(r)))
             for r in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for _, e in outs]
    results = [json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
               for out, _ in outs]
    assert [(r["rank"], r["world"]) for r in results] == [(0, 2), (1, 2)]
    assert results[0]["checksum"] == results[1]["checksum"], results
    assert all(r["threads"] == [1] for r in results), results
