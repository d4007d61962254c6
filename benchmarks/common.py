"""Helpers for the benchmark scripts: run a worker process, save JSON, draw a PNG."""
from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
REPO = HERE.parent
TF_WORKER = "benchmarks.framework.tf_worker"    # the measuring process BurstWorker runs
TORCH_WORKER = "benchmarks.framework.torch_worker"   # PyTorch's, run by .venv-torch's Python
TORCH_PYTHON = REPO / ".venv-torch" / "bin" / "python"   # scripts/setup.sh --torch
PWA = REPO / "tests" / "fixtures" / "swf" / "pwa"      # Parallel Workloads Archive logs
# Each trace on a cluster of its machine's processors: (file, nodes, cores per node). NASA's
# iPSC/860 had 128 single-processor nodes and KTH's SP2 100; grouped into multi-core nodes here
# so that the agents have cores to lend and node counts can move. Thunder is 1,002 nodes of 4.
# Thunder's 1,002 nodes make conservative backfill's search of every node's future slow here
# (over 3 minutes for its first 3,000 jobs under static alone): simulator/goals.py runs its first
# --thunder-jobs.
TRACES = (("NASA-iPSC-1993-3.1-cln.swf.gz", 8, 16), ("KTH-SP2-1996-2.1-cln.swf.gz", 10, 10),
          ("LLNL-Thunder-2007-1.1-cln.swf.gz", 1002, 4))
# Round 3 adds two machines of multi-core nodes on their own shapes (SOURCES.md): SDSC Blue
# Horizon, 144 nodes of 8, and LLNL Atlas, 1,152 nodes of 8 (a Slurm cluster, like Thunder).
ROUND3_TRACES = TRACES + (("SDSC-BLUE-2000-4.2-cln.swf.gz", 144, 8),
                          ("LLNL-Atlas-2006-2.1-cln.swf.gz", 1152, 8))


def trace_workload(name: str, *, first: int, malleable_fraction: float,
                   speedup: str = "calibrated"):
    """The first ``first`` jobs of the trace ``name`` of TRACES on its cluster, as every
    benchmark replays it (seed 1 marks the malleable jobs; ``speedup``: a SpeedupModel value):
    (SwfWorkload, nodes, cores). The simulator is imported here, from whichever code root is on
    sys.path."""
    from malleable_sim import SpeedupModel, read_swf, swf_workload
    nodes, cores = next((n, c) for trace, n, c in TRACES if trace == name)
    return swf_workload(read_swf((PWA / name).read_bytes()), nodes=nodes, cores=cores,
                        malleable_fraction=malleable_fraction, seed=1, first=first,
                        speedup=SpeedupModel(speedup)), nodes, cores


def run_worker(module: str, args: list[str], *, code_root: Path = REPO, timeout: float = 600,
               env: dict | None = None) -> dict:
    """Run ``python -m module args...`` and return the JSON after its "RESULT " line.

    The worker imports the project's packages from ``code_root`` (another commit's checkout, to
    measure its code beside this one's) and the benchmarks from this checkout: ``-P`` keeps the
    working folder off sys.path, and PYTHONPATH names a folder holding only a link to this
    checkout's benchmarks/, then the code root."""
    with tempfile.TemporaryDirectory(prefix="bench-path-") as links:
        (Path(links) / "benchmarks").symlink_to(HERE, target_is_directory=True)
        path = os.pathsep.join([links, str(code_root)])
        proc = subprocess.run([sys.executable, "-P", "-m", module, *args], cwd=links,
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {}), "PYTHONPATH": path})
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"worker {module} {args} printed no result (exit {proc.returncode}):\n"
                       f"{proc.stderr[-3000:]}")


@contextlib.contextmanager
def checkout_of(ref: str, folder: Path):
    """The repository at ``ref`` in ``folder`` (a detached git worktree, removed after): code
    of another commit to measure beside this checkout's."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(folder),
                    ref], check=True, timeout=120)
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(folder)],
                       timeout=120)


class BurstWorker:
    """A measuring process kept alive between its bursts and stopped (SIGSTOP) while another
    one measures. Two configurations can then alternate every second in one run: slow drifts
    of a shared machine's load hit both alike, and an idle worker's threads disturb nothing.

    ``args`` are a module of this checkout (``benchmarks.framework.tf_worker``) and its
    arguments. The worker prints "READY" once set up, then answers each stdin line "<workload> <seconds>"
    with one "RESULT {json}" line.
    """

    def __init__(self, args: list[str], *, env: dict | None = None, python: str = sys.executable):
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.python = python   # the interpreter (an environment with another framework)
        self.proc: subprocess.Popen | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+")   # shown when the worker fails

    def start(self, timeout: float = 300,
              resize: "Callable[[BurstWorker], None] | None" = None) -> dict:
        """Start the worker and wait until it is READY; then stop it. A worker that prints
        "STARTED" first (tf_worker.py) is resized by ``resize(self)`` and told "GO". Returns the
        JSON the READY line carries ({} if none)."""
        self.proc = subprocess.Popen([self.python, "-m", *self.args], cwd=REPO, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, env=self.env)
        if resize is not None:
            self._expect("STARTED", timeout)
            resize(self)
            self.send("GO")
        ready = self._expect("READY", timeout)
        os.kill(self.proc.pid, signal.SIGSTOP)
        return json.loads(ready) if ready else {}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix):].strip()
            if line.startswith("FAILED"):
                raise RuntimeError(f"worker {self.args}: {line.strip()}\n{self.stderr_tail()}")
            if time.monotonic() > deadline:
                break
        raise RuntimeError(f"worker {self.args} did not print {prefix!r} "
                           f"(exit {self.proc.poll()})\n{self.stderr_tail()}")

    def stderr_tail(self, chars: int = 3000) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-chars:]

    def burst(self, workload: str, seconds: float) -> dict:
        os.kill(self.proc.pid, signal.SIGCONT)
        try:
            self.send(f"{workload} {seconds}")
            return json.loads(self._expect("RESULT ", seconds * 10 + 60))
        finally:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class CpusetFolder:
    """A cpuset cgroup (v1) of the benchmark's own: workers join it (tf_worker.py --cgroup) and
    the driver changes its CPUs while they run. ``remove`` moves stragglers out and deletes it."""

    ROOT = Path("/sys/fs/cgroup/cpuset")

    def __init__(self, name: str, cpus: str):
        self.path = self.ROOT / f"malleable_bench_{os.getpid()}_{name}"
        self.path.mkdir()
        (self.path / "cpuset.mems").write_text((self.ROOT / "cpuset.mems").read_text())
        self.set_cpus(cpus)

    def set_cpus(self, cpus: str) -> None:
        (self.path / "cpuset.cpus").write_text(cpus)

    def remove(self) -> None:
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                (self.ROOT / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # exited meanwhile
        self.path.rmdir()


def take_turns(workers: dict[str, BurstWorker], workloads: list[str] | tuple[str, ...],
               rounds: int, seconds: float, rng: random.Random) -> dict[str, list[dict]]:
    """``rounds`` rounds of bursts: in each, every workload once on every worker, the workers in
    random order. Returns, per worker, one {workload: {"wall", "cpu"}} per round."""
    out: dict[str, list[dict]] = {k: [] for k in workers}
    for _ in range(rounds):
        got: dict[str, dict] = {k: {} for k in workers}
        for workload in workloads:
            order = list(workers)
            rng.shuffle(order)
            for k in order:
                got[k][workload] = workers[k].burst(workload, seconds)
        for k in workers:
            out[k].append(got[k])
    return out


def ratio_stats(num: list[list[dict]], den: list[list[dict]], workload: str,
                kind: str = "wall") -> dict:
    """Per-round ratios num/den of a workload's steps/s (``kind``: per wall-clock second, or
    "cpu": per second of the process's CPU time), grouped by pair (one fresh set of processes):
    their median, a bootstrap 95% CI resampling pairs, and each pair's median."""
    groups = [[a[workload][kind] / b[workload][kind] for a, b in zip(pa, pb)]
              for pa, pb in zip(num, den)]
    ratios = [r for g in groups for r in g]
    lo, hi = median_ci(groups)
    return {"median": median(ratios), "ci95": [lo, hi], "ratios": ratios,
            "pair_medians": [median(g) for g in groups]}


def median_ci(groups: list[list[float]], *, level: float = 0.95, resamples: int = 2000,
              seed: int = 0) -> tuple[float, float]:
    """A bootstrap confidence interval of the median of all values, resampling whole groups
    (the rounds of one pair of processes): a process can be lucky or unlucky for its whole life,
    so its rounds are not independent of each other."""
    groups = [g for g in groups if g]
    if not groups:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    meds = sorted(statistics.median([x for g in rng.choices(groups, k=len(groups)) for x in g])
                  for _ in range(resamples))
    lo = meds[int((1 - level) / 2 * resamples)]
    hi = meds[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


def geomean_interval(values: Sequence[float], *, resamples: int = 2000, seed: int = 0) -> dict:
    """The geometric mean of paired ratios and its bootstrap 95% interval (percentile, the
    pairs resampled)."""
    logs = [math.log(v) for v in values if v > 0]
    if not logs:
        return {"geomean": None, "lo": None, "hi": None, "n": 0}
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(logs, k=len(logs))) / len(logs) for _ in range(resamples))
    return {"geomean": round(math.exp(sum(logs) / len(logs)), 4),
            "lo": round(math.exp(means[int(0.025 * resamples)]), 4),
            "hi": round(math.exp(means[int(0.975 * resamples) - 1]), 4), "n": len(logs)}


def machine() -> dict:
    return {"cpus": os.cpu_count(), "allowed_cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "kernel": platform.release(),
            "loadavg_start": os.getloadavg()[0], "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


def save(name: str, data: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=True))
    print(f"wrote {path}")
    return path


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def percentile(xs, q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[k]


def steps_per_second(step, *, seconds: float = 3.0, warmup: int = 3) -> dict[str, float]:
    """Steps per wall-clock second, and per second of this process's CPU time. The second is
    less disturbed by other tenants of a shared machine (it still counts cache and frequency
    effects), so the benchmarks report both."""
    for _ in range(warmup):
        step()
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"wall": n / wall, "cpu": n / cpu if cpu > 0 else float("nan")}


@contextlib.contextmanager
def torch_worker_in_cpuset(name: str, module: str, args: list[str] | None = None):
    """A worker on .venv-torch's Python (``python -m module args``) in a cpuset folder of its
    own, on every core at first: yields (the process, its CpusetFolder, the cores' list); the
    process is killed and the folder removed after."""
    full = (CpusetFolder.ROOT / "cpuset.cpus").read_text().strip()
    folder = CpusetFolder(name, full)
    proc = None
    try:
        proc = subprocess.Popen([str(TORCH_PYTHON), "-m", module, *(args or [])], cwd=REPO,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True,
                                env={**os.environ, "MALLEABLE_TF_LOG": "0"})
        (folder.path / "cgroup.procs").write_text(str(proc.pid))
        yield proc, folder, full
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        folder.remove()
