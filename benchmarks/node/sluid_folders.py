"""What telling job folders named by SLUID costs a hook (issue 39), beside folders named job_<J>,
side by side in one run, alternating, on this machine's kernel.

Slurm 26.05 on cgroup v2 names a job's folder by its SLUID unless cgroup.conf says
CgroupJobIdPaths=yes. Its job id is then what a slurmstepd in it says
(``slurm_plugin.cgroups.stepd_job_in``: the folder's step folders listed, an lstat of
``step_<S>/slurm``, its cgroup.procs read, and per pid four reads through one /proc descriptor).
A hook is a fresh process, so it tells every SLUID folder of the node anew; the agent keeps what
it was told. A ``job_<J>`` folder says its job in its name.

The node here is real kernel objects: K job folders in this host's cpuset hierarchy (cgroup v1
here: the same folders, files and /proc reads as v2's tree, under another mount), each with
``step_batch/slurm`` and ``step_batch/user/task_0``, and in each ``step_batch/slurm`` a real
process of root's named ``slurmstepd`` and titled ``slurmstepd: [<J>.batch]``, as slurmstepd
is. The same K jobs again in folders named ``job_<J>``. Rows, per K:

- ``tell_all``: every job folder of the node told (a fresh layout, as a hook has): the scan the
  Prolog's and Epilog's checks make (``job_id_of`` on each folder name);
- ``folder_of_last``: the folder of the job made last (``job_dir``), as a hook finds its own
  job's folder;
- ``hook_python_floor``: beside them, what every hook that starts Python pays anyway (the
  interpreter's start and the hook's imports, as ``prolog_cost.py`` measures it), every tenth run.

    python -m benchmarks.node.sluid_folders [--runs 200] [--counts 1,8,32,64]   (as root)
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine, median, percentile, save
from slurm_plugin.cgroups import (CgroupVersion, JobFolderNames, SlurmCgroupLayout,
                                  remove_cgroup_tree)

CPUSET = Path("/sys/fs/cgroup/cpuset")
ROOT = "/malleable_bench_sluid"            # this benchmark's folder in the hierarchy
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
FIRST_JOB = 1001


def sluid(rng: random.Random) -> str:
    """A SLUID's form: "s", a first character 0-F, then 12 of Crockford's base 32."""
    return "s" + rng.choice(CROCKFORD[:16]) + "".join(rng.choice(CROCKFORD) for _ in range(12))


def make_node(top: Path, names: dict[int, str], stepd_exe: Path) -> list[subprocess.Popen]:
    """Job folders ``top/<name>/step_batch/{slurm,user/task_0}``, a "slurmstepd" in each
    ``slurm`` folder; the processes."""
    procs = []
    for job, name in names.items():
        home = top / name / "step_batch" / "slurm"
        home.mkdir(parents=True)
        (top / name / "step_batch" / "user" / "task_0").mkdir(parents=True)
        p = subprocess.Popen([f"slurmstepd: [{job}.batch]", "3600"], executable=str(stepd_exe),
                             stdin=subprocess.DEVNULL)
        (home / "cgroup.procs").write_text(f"{p.pid}\n")
        procs.append(p)
    return procs


def tell_all(layout: SlurmCgroupLayout) -> list[int | None]:
    with os.scandir(layout.node_dir()) as it:
        return [layout.job_id_of(e.name) for e in it if e.is_dir()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--counts", default="1,8,32,64")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the folders are cgroups and the slurmstepds root's")
    counts = [int(x) for x in args.counts.split(",")]
    rng = random.Random(1)
    base = CPUSET / ROOT.lstrip("/")
    remove_cgroup_tree(base)      # a run's leftovers, if it was killed
    base.mkdir()
    (base / "cgroup.clone_children").write_text("1")     # v1: children take the parent's CPUs
    for name in ("cpuset.cpus", "cpuset.mems"):
        (base / name).write_text((CPUSET / name).read_text())
    procs: list[subprocess.Popen] = []
    rows: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="malleable-sluid-bench-") as tmp:
        stepd_exe = Path(tmp) / "slurmstepd"
        shutil.copy(shutil.which("sleep") or "/bin/sleep", stepd_exe)
        try:
            layouts = {}
            for naming in ("sluid", "job_id"):
                for k in counts:
                    root = f"{ROOT}/{naming}_{k}"
                    names = {FIRST_JOB + i: sluid(rng) if naming == "sluid"
                             else f"job_{FIRST_JOB + i}" for i in range(k)}
                    (CPUSET / root.lstrip("/")).mkdir()
                    procs += make_node(CPUSET / root.lstrip("/"), names, stepd_exe)
                    layouts[(naming, k)] = root
            # Each layout once, checked: every folder told its job.
            for (naming, k), root in layouts.items():
                layout = SlurmCgroupLayout("bench", CgroupVersion.V2, CPUSET, root)
                told = sorted(j for j in tell_all(layout) if j is not None)
                assert told == list(range(FIRST_JOB, FIRST_JOB + k)), (naming, k, told)
                last = FIRST_JOB + k - 1
                assert layout.job_dir(0, last).name != f"job_{last}" or naming == "job_id"
            for run in range(args.runs):
                if run % 10 == 0:
                    t0 = time.perf_counter()
                    subprocess.run([sys.executable, "-I", "-c",
                                    "import slurm_plugin.hooks.job_hooks"], check=True, cwd="/")
                    rows.setdefault("hook_python_floor", {}).setdefault("us", []).append(
                        (time.perf_counter() - t0) * 1e6)
                for (naming, k), root in layouts.items():
                    for row, work in (("tell_all", tell_all),
                                      ("folder_of_last",
                                       lambda lay, k=k: lay.job_dir(0, FIRST_JOB + k - 1))):
                        # A fresh layout and cache, as a hook (a new process) has.
                        layout = SlurmCgroupLayout("bench", CgroupVersion.V2, CPUSET, root,
                                                   JobFolderNames())
                        t0 = time.perf_counter()
                        work(layout)
                        rows.setdefault(f"{row} {naming} K={k}", {}).setdefault("us", []).append(
                            (time.perf_counter() - t0) * 1e6)
        finally:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
            failed = remove_cgroup_tree(base).failed
            if failed:
                print(f"not removed: {failed}", file=sys.stderr)
    out = {name: {"p50_us": round(median(r["us"]), 1), "p90_us": round(percentile(r["us"], 90), 1),
                  "runs": len(r["us"])} for name, r in rows.items()}
    floor = out["hook_python_floor"]["p50_us"]
    ratios: dict[str, dict[str, float | None]] = {}
    for k in counts:
        for row in ("tell_all", "folder_of_last"):
            more = round(out[f"{row} sluid K={k}"]["p50_us"] - out[f"{row} job_id K={k}"]["p50_us"], 1)
            per_folder = round(more / k, 1) if row == "tell_all" else None
            ratios[f"{row} K={k}"] = {"sluid_minus_job_id_p50_us": more,
                                      "per_sluid_folder_us": per_folder}
            if row == "tell_all":
                ratios[f"{row} K={k}"]["share_of_python_floor"] = round(more / floor, 3)
    for name, r in out.items():
        print(f"{name:28s} p50 {r['p50_us']:9.1f} us  p90 {r['p90_us']:9.1f} us")
    for name, r in ratios.items():
        print(f"{name:22s} SLUID costs {r['sluid_minus_job_id_p50_us']:8.1f} us more"
              + (f" ({r['per_sluid_folder_us']} us per folder)" if r["per_sluid_folder_us"] else ""))
    save("sluid_folders", {"machine": machine(), "runs": args.runs, "rows": out,
                           "sluid_over_job_id": ratios,
                           "note": "cgroup v1's cpuset hierarchy stands in for v2's tree; "
                                   "real processes titled as slurmstepd, real /proc reads"})


if __name__ == "__main__":
    main()
