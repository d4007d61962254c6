"""Small helpers shared by the integration tests."""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from malleable_protocol import parse_cpu_list
from malleable_protocol.records import MAX_RECORD_BYTES
from malleable_protocol.safe_io import read_bounded
from slurm_plugin.cgroups import LayoutUnknown
from slurm_plugin.slurm import JobState


@dataclass(frozen=True)
class SlowWait:
    """A wait that held, but after more than half its time: the run's summary lists these, so a
    wait near its limit shows before it fails on a slower or busier machine."""
    test: str
    what: str
    seconds: float
    timeout: float


SLOW_WAITS: list[SlowWait] = []


def wait_for(pred, timeout=30.0, what="condition", show=None):
    """Poll ``pred`` until it returns something true; on timeout, say what and ``show()``."""
    start = time.monotonic()
    deadline = start + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            took = time.monotonic() - start
            if took > timeout / 2:
                test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
                SLOW_WAITS.append(SlowWait(test, what, took, timeout))
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}" + (f": {show()}" if show else ""))


def agent_events(cluster, node: str) -> list[dict]:
    """The lines of ``node``'s agent event log (none before its first event)."""
    log = cluster.paths.root / "agent" / f"events-{node}.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def rank_statuses(folder: Path, pattern: str = "rank_*.json") -> dict[int, dict]:
    """The malleable_tf status records in ``folder``, by rank (files being replaced are skipped);
    the CPU lists as sorted lists of ids."""
    out = {}
    for f in folder.glob(pattern):
        try:   # the job's user may have planted links, FIFOs or huge files here
            d = json.loads(read_bounded(f, MAX_RECORD_BYTES))
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and "rank" in d:
            for key in ("allowed_cpus", "share_cpus"):
                d[key] = sorted(parse_cpu_list(d.get(key, "")))
            out[d["rank"]] = d
    return out


def cgroup_cpus(cluster, node: str, job_id: int, step: str = "",
                uid: int = 0) -> frozenset[int] | None:
    """The CPUs of a job's cpuset folder on ``node`` (or of its ``step`` folder), where the
    node's discovered layout puts it; None when the folder does not exist."""
    try:
        return parse_cpu_list(cluster.cgroup_layout(node).cpus_file(uid, job_id, step or None)
                              .read_text())
    except (OSError, LayoutUnknown):
        # No folder: the job's not made yet, nor (between jobs: slurmstepd removes it with
        # the last job) the node's slurm_<node> folder the layout is discovered from.
        return None


def job_cpus_shell(node: str, job: int | str, step: str | None = None, uid: int = 0, *,
                   slurm_conf: Path | None = None,
                   malleable: tuple[str, ...] = (sys.executable, "-m", "slurm_plugin.commands.main")) -> str:
    """A shell expression for a job script that prints a job's CPUs on ``node`` (``job`` may be
    "$SLURM_JOB_ID"), read through the node's discovered layout (``malleable cgroups``;
    ``malleable``: how the job's node runs that command)."""
    argv = [*malleable, "cgroups", "--node", node, "--uid", str(uid), "--job", str(job)]
    argv += ["--slurm-conf", str(slurm_conf)] if slurm_conf else []
    argv += ["--step", step] if step else []
    return "$(" + " ".join(a if a == "$SLURM_JOB_ID" else shlex.quote(a) for a in argv) + ")"


def step_records(cluster, job_id: int) -> dict[str, dict]:
    """The job's rank records by step (one rank per step here)."""
    out = {}
    for f in cluster.run_layout.job_dir(job_id).glob("rank_*.step_*.json"):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        d["allowed"] = parse_cpu_list(d["allowed_cpus"])
        out[f.name.split(".")[1]] = d
    return out


def timeline(cluster, node: str, job_id: int) -> list[str]:
    """What the test saw, for failure messages: the job folder and each rank."""
    return [f"job={sorted(cgroup_cpus(cluster, node, job_id) or ())} " + " ".join(
        f"{s}:cpus={sorted(r['allowed'])},threads={r['intra_active']}"
        for s, r in sorted(step_records(cluster, job_id).items()))]


def finish(client, job_id: int, timeout: float = 120.0):
    """Wait until the job has ended; its final state."""
    return wait_for(lambda: (lambda j: j.state if not j.state.holds_cores and
                             j.state is not JobState.PENDING else None)(client.job(job_id)),
                    timeout=timeout, what=f"job {job_id} to end")


def stop_then_cancel(client, job_id: int, stop: Path, timeout: float = 60.0) -> None:
    """Touch the job's stop file, give it ``timeout`` to end by itself, then cancel it. A
    process that exits runs its atexit handlers (TensorFlow's autograph removes its files in
    /tmp then); one that scancel kills leaves them."""
    stop.touch()
    try:
        finish(client, job_id, timeout)
    except AssertionError:
        client.cancel(job_id)


# --- two workers of one job on two nodes (test_multiworker, test_torch_cluster) ------------------

def two_workers_threads(folder: Path) -> dict[int, int] | None:
    """Each of a job's two workers' active intra-op threads, once both have a status record."""
    st = rank_statuses(folder)
    return {r: d["intra_active"] for r, d in st.items()} if len(st) == 2 else None


# Frames that say where a stalled TensorFlow worker waits (its own parking and gate, collectives,
# tf.data, Python functions); idle pool threads are left out.
_STALL_FRAMES = ("mtf_", "Malleable", "Collective", "GetNext", "PyFunc", "EagerPy", "Notification",
                 "RunClosure", "PyEval_RestoreThread", "take_gil")


def native_stacks(pid: int, max_lines: int = 40) -> str:
    """gdb's backtrace of every thread of ``pid``, only the threads with a frame of
    ``_STALL_FRAMES``, in short: what a hung worker's test shows (it is killed right after)."""
    import subprocess
    try:
        out = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 12"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(no stacks of {pid}: {exc})"
    kept = []
    for thread in out.split("\nThread ")[1:]:
        frames = [re.sub(r"^#\d+\s+(0x[0-9a-f]+ in )?", "", line).split(" (")[0]
                  for line in thread.splitlines()[1:] if line.startswith("#")]
        if any(mark in f for f in frames for mark in _STALL_FRAMES):
            kept.append(thread.splitlines()[0][:60] + ": " + " < ".join(frames[:8]))
    return "\n".join(kept[:max_lines]) or f"(no thread of {pid} in {_STALL_FRAMES})"


def two_workers_view(folder: Path, output: Path):
    """What a failed wait shows: the workers' threads, where each waits (native stacks, while
    they live), and the job output's tail."""
    def show() -> str:
        tail = output.read_text()[-1500:] if output.exists() else "(no output yet)"
        stacks = "\n".join(f"--- worker {r} (pid {d['pid']}):\n{native_stacks(d['pid'])}"
                           for r, d in sorted(rank_statuses(folder).items()))
        return f"{two_workers_threads(folder)}\n{stacks}\njob output: {tail}"
    return show


def resize_seconds(env: dict, job_id: int, folder: Path, cpus: int) -> float:
    """``scontrol update`` to ``cpus`` per node, then the seconds until both workers' status
    records show that many threads (polled every 10 ms)."""
    import subprocess
    t0 = time.monotonic()
    subprocess.run(["scontrol", "update", f"JobId={job_id}", f"Comment=malleable:cpus={cpus}"],
                   check=True, env=env, capture_output=True)
    deadline = t0 + 20
    while time.monotonic() < deadline:
        if two_workers_threads(folder) == {0: cpus, 1: cpus}:
            return time.monotonic() - t0
        time.sleep(0.01)
    raise AssertionError(f"workers at {two_workers_threads(folder)} 20 s after cpus={cpus}")


def grow_take_back_and_resize(client, env: dict, job_id: int, folder: Path, tmp_path: Path,
                              show) -> list[float]:
    """The scenario a two-worker job on an1 and an2 goes through with lend-idle agents: it grows
    into each node's idle core (both workers at 2 threads); a second job on an2 takes that core
    back in its Prolog (both at 1: the agents size a job across its nodes as one) and gives it
    again at its end (2); ``scontrol update`` resizes it 1 -> 2 -> 1 -> 2. Returns the seconds
    from each ``scontrol update`` to both workers' threads."""
    wait_for(lambda: two_workers_threads(folder) == {0: 2, 1: 2}, timeout=180,
             what="both workers at 2 threads", show=show)
    sleeper = tmp_path / "sleep.sh"
    sleeper.write_text("#!/bin/bash\nsleep 600\n")
    other = client.submit(sleeper, ["-N1", "-c1", "-w", "an2", f"-o{tmp_path}/other"])
    try:
        wait_for(lambda: two_workers_threads(folder) == {0: 1, 1: 1}, timeout=60,
                 what="both workers at 1 thread after another job took an2's core", show=show)
    finally:
        client.cancel(other)
    wait_for(lambda: two_workers_threads(folder) == {0: 2, 1: 2}, timeout=60,
             what="both workers at 2 threads again", show=show)
    out = []
    for cpus in (1, 2, 1, 2):
        # Apart by more than the watcher's least gap between polls (event_min_gap_s, 0.25 s:
        # a user's loop of updates costs slurmctld at most 4 polls a second), so that each
        # time is one resize's, not the wait for that gap.
        time.sleep(0.4)
        out.append(resize_seconds(env, job_id, folder, cpus))
    return out


@dataclass(frozen=True)
class TwoWorkerJob:
    """A job of one worker on an1 and one on an2, submitted from a batch template (-c1, up to
    2 cores a node): what the two-worker tests watch."""

    job_id: int
    folder: Path        # its co-scheduler folder (the workers' status records)
    env: dict           # the cluster's environment (scontrol)
    report: Path        # where the training script writes its epochs
    stop: Path          # the file that stops it
    show: object        # what a failed wait shows


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "user-guide.md"
GUIDE_SECTION = "## Ten minutes with the script you have"


def guide_command(label: str) -> list[str]:
    """The ``malleable-sbatch`` command the user guide's ten-minute section gives for the
    script kind in bold (``PyTorch DDP``, ``Keras 3 across nodes``, ``Horovod``), as argv: the
    tests submit what the guide tells users to type."""
    section = GUIDE.read_text().split(GUIDE_SECTION, 1)[1].split("\n## ", 1)[0]
    for bullet in section.split("\n- ")[1:]:
        if bullet.startswith(f"**{label}**"):
            m = re.search(r"`(malleable-sbatch [^`]*)`", bullet)
            if m:
                return shlex.split(" ".join(m.group(1).split()))
    raise AssertionError(f"the user guide gives no malleable-sbatch command for {label!r}")


def submit_as_written(cluster, tmp_path: Path, command: list[str], python: Path, program: Path,
                      sets: dict[str, str], options: list[str]) -> int:
    """Run ``command`` (``malleable-sbatch TEMPLATE --set program=train.py ... [-- OPTIONS]``)
    as a user would in ``python``'s environment (its bin first on PATH), with ``train.py``
    replaced by ``program``, this test's ``--set`` values and sbatch ``options`` added. The
    script it submits is kept as tmp_path/job.sh (its ``--dry-run``). Returns the job id."""
    import os
    import subprocess

    from sbatch_templates.cli import split_passthrough
    assert command[0] == "malleable-sbatch", command
    own, passthrough = split_passthrough(command[1:])
    own = [f"program={program}" if a == "program=train.py" else a for a in own]
    assert f"program={program}" in own, f"the command names no program=train.py: {command}"
    for key, value in sets.items():
        own += ["--set", f"{key}={value}"]
    env = {**os.environ, **cluster.env(),
           "PATH": f"{python.parent}:{cluster.env().get('PATH', os.environ['PATH'])}"}
    exe = str(python.parent / "malleable-sbatch")
    dry = subprocess.run([exe, *own, "--dry-run", "--", *passthrough, *options], env=env,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    (tmp_path / "job.sh").write_text(dry.stdout)
    out = subprocess.run([exe, *own, "--", *passthrough, "--parsable", *options], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{command}: {out.stderr}"
    return int(out.stdout.strip().split(";")[0])


def submit_two_workers(cluster, client, tmp_path: Path, command: list[str], python: Path,
                       program: Path, args: str) -> TwoWorkerJob:
    """Submit ``command`` (the guide's, or a ``malleable-sbatch`` line of the test's own) for
    ``program`` in ``python``'s environment, with ``--report``/``--until`` added to ``args``,
    one core asked on each of an1 and an2."""
    import os

    tmp_path.chmod(0o777)
    report, stop = tmp_path / "report", tmp_path / "stop"
    job_id = submit_as_written(cluster, tmp_path, command, python, program, {
        "min_cpus": "1", "max_cpus": "2", "output": f"{tmp_path}/out",
        "args": f"{args} --report {report} --until {stop}"}, ["-c1", "-w", "an1,an2"])
    folder = cluster.run_layout.job_dir(job_id)
    return TwoWorkerJob(job_id, folder, {**os.environ, **cluster.env()}, report, stop,
                        two_workers_view(folder, tmp_path / "out"))


def epoch_lines(report: Path, rank: int) -> list[dict]:
    """The JSON lines a training script wrote per epoch (``--report``)."""
    path = report / f"epochs-{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
