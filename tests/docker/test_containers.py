"""Malleable containers: the container co-scheduler (`malleable containers`) on this host's
Docker engine, with real TensorFlow training containers of docker-slurm's image.

The agent hands out CPUs 0-1 (this machine's two), so three containers of at least one core
each cannot all run at once: the third waits, created, until a core is free (as a Slurm job
waits pending), then starts on it.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from malleable_protocol import parse_cpu_list

from ..integration.helpers import wait_for

PROGRAM = Path(__file__).parent.parent / "programs" / "train_until.py"


def docker(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise AssertionError(f"docker {' '.join(argv)}: {out.stderr.strip()}")
    return out


@pytest.fixture
def training(docker_slurm, jobs_dir):
    """create(name): a malleable training container, created (the co-scheduler starts it)."""
    shutil.copy(PROGRAM, jobs_dir / PROGRAM.name)
    made = []

    def create(name: str) -> str:
        cid = docker("create", "--name", name, "--label", "malleable=min=1,max=node",
                     "-v", f"{jobs_dir}:/jobs", "-e", f"MALLEABLE_TF_STATUS=/jobs/{name}.json",
                     "--entrypoint", "/opt/malleable/venv/bin/python", docker_slurm.image,
                     "-m", "malleable_tf.run", f"/jobs/{PROGRAM.name}", f"/jobs/{name}.stop"
                     ).stdout.strip()
        made.append(name)
        return cid

    yield create
    for name in made:
        (jobs_dir / f"{name}.stop").touch()
    time.sleep(1)
    for name in made:
        docker("rm", "-f", name, check=False)


@pytest.fixture
def agent(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "slurm_plugin.commands.main", "containers",
                             "--cpus", "0-1", "--state-dir", str(tmp_path / "state"),
                             "--interval", "0.3"], stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "agent.log", "w"))
    yield tmp_path / "agent.log"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def inspect(name: str) -> tuple[str, frozenset[int]]:
    d = json.loads(docker("inspect", name).stdout)[0]
    return d["State"]["Status"], parse_cpu_list(d["HostConfig"]["CpusetCpus"] or "0-1")


def threads(jobs_dir: Path, name: str) -> int | None:
    try:
        return json.loads((jobs_dir / f"{name}.json").read_text())["intra_active"]
    except (OSError, ValueError, KeyError):
        return None


def test_two_training_containers_share_the_cores_a_third_waits_then_starts(
        training, agent, jobs_dir):
    show = lambda: (inspect("mtf-a"), threads(jobs_dir, "mtf-a"), agent.read_text()[-1500:])  # noqa: E731
    training("mtf-a")
    # Alone: admitted on one core, started, then lent the idle one; its threads follow.
    wait_for(lambda: inspect("mtf-a") == ("running", {0, 1}), timeout=30, what="a on 2 cores",
             show=show)
    wait_for(lambda: threads(jobs_dir, "mtf-a") == 2, timeout=120, what="a at 2 threads",
             show=show)
    training("mtf-b")
    wait_for(lambda: inspect("mtf-b")[0] == "running", timeout=30, what="b started", show=show)
    a_cpus, b_cpus = inspect("mtf-a")[1], inspect("mtf-b")[1]
    assert a_cpus == {0} and b_cpus == {1}
    wait_for(lambda: threads(jobs_dir, "mtf-a") == 1, timeout=30, what="a down to 1 thread",
             show=show)
    wait_for(lambda: threads(jobs_dir, "mtf-b") == 1, timeout=120, what="b at 1 thread")
    # A third: no core is free, so it waits, created, and the others keep theirs.
    training("mtf-c")
    time.sleep(3)
    assert inspect("mtf-c")[0] == "created"
    assert (inspect("mtf-a")[1], inspect("mtf-b")[1]) == ({0}, {1})
    # b finishes: c starts on the core b had, a stays on its own (nothing is idle to lend).
    (jobs_dir / "mtf-b.stop").touch()
    wait_for(lambda: inspect("mtf-c")[0] == "running", timeout=60, what="c started",
             show=lambda: (inspect("mtf-b"), inspect("mtf-c"), agent.read_text()[-1500:]))
    assert inspect("mtf-c")[1] == {1} and inspect("mtf-a")[1] == {0}
    wait_for(lambda: threads(jobs_dir, "mtf-c") == 1, timeout=120, what="c at 1 thread")
    # c finishes: a is lent the idle core again, and its threads follow.
    (jobs_dir / "mtf-c.stop").touch()
    wait_for(lambda: inspect("mtf-a")[1] == {0, 1}, timeout=60, what="a grown back", show=show)
    wait_for(lambda: threads(jobs_dir, "mtf-a") == 2, timeout=30, what="a back at 2 threads",
             show=show)
