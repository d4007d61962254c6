"""The root CPU one job's input costs the agent per cycle, for each attack a job user can mount
on his own files and folders (issue 40: no more than 20 ms of root CPU per cycle on one
user's input, whatever it holds; the scan of his folders is charged to the same budget as his
records). Everything is real files on this machine: the job's record folder,
and a v1-shaped cgroup tree below the job folder (plain folders: the walk and reads are the
same syscalls). For each case, the agent's per-job work of one cycle, measured with the thread
CPU clock: the scan of the job's cgroup folders (``CpusetActuator.scan``), its records through
the budgeted reader (``RankReader``), as the observer does, then the policy's decision on a node
of that job and a clean one (``decide``, where the ranks a job claims are expanded); a clean job
of one rank measured in the same run is the reference.

    python -m benchmarks.node.hostile_input_cost [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine, save

from malleable_protocol import RankStatus, RunLayout
from slurm_plugin.cgroups import CgroupVersion, SlurmCgroupLayout
from slurm_plugin.node.cgroup_actuator import CpusetActuator
from slurm_plugin.node.ranks import InputBudgetExceeded, RankReader
from malleable_policy.decide import decide
from malleable_policy.model import JobView, NodeSnapshot, Policy
from malleable_policy.request import MalleableSpec

UID, JOB = 4321, 7
GOOD = RankStatus(pid=10, rank=0, local_rank=0, local_size=1, intra_active=2, intra_pool=2,
                  inter_active=2, inter_pool=2, steps_per_s={1: 1.0, 2: 2.0})


def record(**kw) -> bytes:
    return json.dumps({**json.loads(GOOD.encode()), **kw}).encode()


LISTS = ",".join(str(2 * i) for i in range(700))      # near the 4 KiB field limit, valid
CASES = {
    "clean": lambda d, cg: _put(d, "rank_0.json", GOOD.encode()),
    "unicode digit key": lambda d, cg: _put(d, "rank_0.json", record(steps_per_s={"²": 1})),
    "1024 cpu-list records": lambda d, cg: [
        _put(d, f"rank_{r}.json", record(rank=r, allowed_cpus=LISTS, share_cpus=LISTS))
        for r in range(1024)],
    "1024 range-bomb records": lambda d, cg: [
        _put(d, f"rank_{r}.json", record(rank=r, allowed_cpus=("0-65535," * 500)[:4000]))
        for r in range(1024)],
    "20000 junk names": lambda d, cg: [_put(d, f"junk_{i}", b"") for i in range(20000)],
    "1024 deep-json records": lambda d, cg: [
        _put(d, f"rank_{r}.json", b'{"pid":' * 2000) for r in range(1024)],
    "1200-deep cgroup tree": lambda d, cg: _nest(cg / "step_0", 1200),
    "5000 cgroup folders": lambda d, cg: [(cg / "step_0" / f"x{i}").mkdir() for i in range(5000)],
    "2000 task-named folders": lambda d, cg: [_cg_folder(cg / "step_0" / f"task_{i}")
                                              for i in range(2000)],
    # Slurm's own: a step of 1,000 tasks (srun -n 1000 --overcommit), each a task folder whose
    # files are root's, as slurmstepd makes them.
    "1000 Slurm task folders": lambda d, cg: [_slurm_folder(cg / "step_0" / f"task_{i}")
                                              for i in range(1000)],
    "1000 Slurm task folders, 1024 cpu-list records": lambda d, cg: [
        *[_slurm_folder(cg / "step_0" / f"task_{i}") for i in range(1000)],
        *[_put(d, f"rank_{r}.json", record(rank=r, allowed_cpus=LISTS, share_cpus=LISTS))
          for r in range(1024)]],
    # Each record a rank of its own step (pid 1000 + i, in step_i), claiming 4,096 ranks there.
    "100 steps of 4096 ranks": lambda d, cg: [
        _put(d, f"rank_{i}.json", record(pid=1000 + i, local_size=4096)) for i in range(100)],
    "1000 steps of 4096 ranks": lambda d, cg: [
        _put(d, f"rank_{i}.json", record(pid=1000 + i, local_size=4096)) for i in range(1000)],
}


def step_of(pid: int, *_: object) -> str:
    return f"step_{pid - 1000}" if pid >= 1000 else "step_0"


def decide_with(job_ranks: tuple, steps: int) -> None:
    S = frozenset
    spec = MalleableSpec(1, None)
    views = (JobView(JOB, UID, "u", S({0, 1}), S({0, 1}), spec=spec, ranks=job_ranks,
                     steps=tuple(f"step_{i}" for i in range(max(steps, 1)))),
             JobView(JOB + 1, UID + 1, "v", S({2, 3}), S({2, 3}), spec=spec))
    decide(NodeSnapshot("n1", S(range(8)), views), Policy.LEND_IDLE)


def _put(d: Path, name: str, data: bytes) -> None:
    (d / name).write_bytes(data)
    os.chown(d / name, UID, UID)


def _cg_folder(p: Path) -> None:
    """A cpuset folder the job's user made: the kernel gives its files to him."""
    p.mkdir()
    (p / "cpuset.cpus").write_text("0-1")
    for f in (p, p / "cpuset.cpus"):
        os.chown(f, UID, UID)


def _slurm_folder(p: Path) -> None:
    p.mkdir()
    (p / "cpuset.cpus").write_text("0-1")


def _nest(p: Path, depth: int) -> None:
    cwd = os.getcwd()
    os.chdir(p)
    try:
        for _ in range(depth):
            os.mkdir("x")
            os.chdir("x")
    finally:
        os.chdir(cwd)


def one_case(name: str, repeat: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="malleable-hostile-bench-"))
    try:
        run = RunLayout(tmp / "run")
        d = run.job_dir(JOB)
        d.mkdir(parents=True)
        os.chown(d, UID, UID)
        layout = SlurmCgroupLayout.named("n1", CgroupVersion.V1, multiple_slurmd=True,
                                         mount=tmp / "cgroup")
        cg = layout.job_dir(UID, JOB)
        for f in (layout.node_dir(), cg.parent, cg, cg / "step_0"):
            f.mkdir(parents=True, exist_ok=True)
            (f / "cpuset.cpus").write_text("0-1")
        CASES[name](d, cg)
        actuator = CpusetActuator(layout)
        reader = RankReader(step_of=step_of)
        samples, outcome = [], ""
        for _ in range(repeat):
            reader.begin_cycle()
            t0 = time.thread_time()
            job = actuator.scan()[JOB]
            reader.charge_cpu(UID, job.scan_cpu_s)     # as the observer does: one budget
            try:
                ranks = reader(run, JOB, UID, layout)
                outcome = f"{len(ranks)} ranks read"
                decide_with(ranks, len({r.step for r in ranks}))
            except InputBudgetExceeded:
                outcome = "budget spent: job held to its allocation"
                decide_with((), 0)
            if job.foreign:
                outcome = "foreign folders: job held to its allocation"
            samples.append(time.thread_time() - t0)
        return {"case": name, "cpu_ms_max": round(max(samples) * 1000, 2),
                "cpu_ms_median": round(sorted(samples)[len(samples) // 2] * 1000, 2),
                "folders_walked": len(job.folders), "outcome": outcome}
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(tmp)], check=True)  # deep trees


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rows = [one_case(name, args.repeat) for name in CASES]
    for r in rows:
        print(f"{r['case']:28s} {r['cpu_ms_max']:8.2f} ms max  {r['outcome']}")
    worst = max(r["cpu_ms_max"] for r in rows)
    clean = next(r for r in rows if r["case"] == "clean")["cpu_ms_max"]
    save("hostile_input_cost", {"machine": machine(), "repeat": args.repeat, "cases": rows,
                                "worst_cpu_ms": worst, "clean_cpu_ms": clean,
                                "goal_cpu_ms": 20})
    print(f"worst {worst:.1f} ms of root CPU per cycle on one job's input (clean job {clean:.2f} ms)")


if __name__ == "__main__":
    main()
