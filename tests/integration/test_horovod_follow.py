"""A 2-rank Horovod job under srun --mpi=pmix on the real cluster: each rank's cpuset is grown
and shrunk from outside, as the co-scheduler will do, and its active threads follow."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_plugin.slurm import JobState

from .helpers import rank_statuses, wait_for

pytestmark = pytest.mark.cluster
PROGRAM = Path(__file__).parent.parent / "programs" / "hvd_train.py"


def write_cpus(folder: Path, cpus: str) -> None:
    (folder / "cpuset.cpus").write_text(cpus)


def statuses(folder: Path) -> dict[int, dict]:
    return rank_statuses(folder, "status-*.json")


def test_two_ranks_follow_their_cpusets(cluster, tmp_path):
    tmp_path.chmod(0o755)
    client = cluster.client()
    stop = tmp_path / "stop"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n"
                      f"export MALLEABLE_TF_STATUS={tmp_path}/status-{{rank}}.json\n"
                      "export TF_CPP_MIN_LOG_LEVEL=2\n"
                      f"srun --mpi=pmix {sys.executable} {PROGRAM} {stop}\n")
    job_id = client.submit(script, ["-N2", "-n2", f"--output={tmp_path}/out", "--time=10"])
    try:
        job = wait_for(lambda: (lambda j: j if j.state is JobState.RUNNING else None)(
            client.job(job_id)), timeout=60, what="job running")
        # Training is under way once each rank has recorded steps/s (at its one Slurm core).
        wait_for(lambda: len(st := statuses(tmp_path)) == 2 and
                 all("1" in s["steps_per_s"] for s in st.values()), timeout=180,
                 what="both ranks training", show=lambda: statuses(tmp_path))
        st = statuses(tmp_path)
        assert all(s["intra_active"] == 1 and s["intra_pool"] == 2 for s in st.values()), st
        all_cpus = ",".join(str(c) for c in range(2))
        folders = {}
        for node in job.nodes:
            core = ",".join(map(str, sorted(job.cpu_ids[node])))
            jobdir = cluster.cgroup_layout(node).job_dir(job.uid, job_id)
            folders[node] = (jobdir, core)
            write_cpus(jobdir, "0-1")               # grow: the job folder first, then the step
            write_cpus(jobdir / "step_0", "0-1")
        wait_for(lambda: all(s["intra_active"] == 2 and s["share_cpus"] == [0, 1]
                             for s in statuses(tmp_path).values()), timeout=10,
                 what=f"both ranks at 2 threads on {all_cpus}", show=lambda: statuses(tmp_path))
        # Steps/s is credited per thread count at batch boundaries: wait for some at 2.
        wait_for(lambda: all("2" in s["steps_per_s"] for s in statuses(tmp_path).values()),
                 timeout=20, what="steps/s at 2 threads", show=lambda: statuses(tmp_path))
        for jobdir, core in folders.values():   # shrink: the step first, then the job folder
            write_cpus(jobdir / "step_0", core)
            write_cpus(jobdir, core)
        wait_for(lambda: all(s["intra_active"] == 1 and len(s["share_cpus"]) == 1
                             for s in statuses(tmp_path).values()), timeout=10,
                 what="both ranks back at 1 thread")
        st = statuses(tmp_path)
        assert all(s["resizes"] >= 3 for s in st.values()), st   # init, grow, shrink
        st = statuses(tmp_path)
        # Each rank ran faster with two cores than with one (both ranks share 2 real cores).
        assert all(s["steps_per_s"]["2"] > s["steps_per_s"]["1"] for s in st.values()), st
        stop.touch()
        job = wait_for(lambda: (lambda j: j if j.state not in (JobState.RUNNING, JobState.PENDING,
                                                             JobState.COMPLETING) else None)(
            client.job(job_id)), timeout=120, what="job end")
        out = (tmp_path / "out").read_text()
        assert job.state is JobState.COMPLETED, out[-3000:]
        lines = [line for line in out.splitlines() if line.startswith("rank ")]
        assert len(lines) == 2, out[-3000:]
        for line in lines:
            f = line.split()
            first, last = float(f[f.index("first_loss") + 1]), float(f[f.index("last_loss") + 1])
            assert last < first, line
    finally:
        stop.touch()
        time.sleep(0.5)
        client.cancel(job_id)


def test_mpirun_distributed_gradient_tape_ranks_follow_taskset(tmp_path):
    """Two ranks on this machine under mpirun: local rank 0 and 1 split the allowed cores, and
    a taskset on one rank from outside moves only that rank."""
    stop = tmp_path / "stop"
    env = {**__import__("os").environ, "MALLEABLE_TF_STATUS": f"{tmp_path}/status-{{rank}}.json",
           "TF_CPP_MIN_LOG_LEVEL": "2", "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    proc = subprocess.Popen(["mpirun", "-np", "2", "--bind-to", "none", "--oversubscribe",
                             sys.executable, str(PROGRAM.parent / "hvd_tape.py"), str(stop)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        wait_for(lambda: len(st := statuses(tmp_path)) == 2 and
                 all(s["share_cpus"] for s in st.values()), timeout=180, what="both ranks up",
                 show=lambda: statuses(tmp_path))
        st = statuses(tmp_path)
        assert {s["local_size"] for s in st.values()} == {2}
        assert sorted(tuple(s["share_cpus"]) for s in st.values()) == [(0,), (1,)]  # no overlap
        rank1 = st[1]["pid"]
        subprocess.run(["taskset", "-a", "-p", "-c", "0", str(rank1)], check=True,
                       capture_output=True)
        # Rank 1's allowance is now core 0 alone: its share is that core, rank 0 is untouched.
        wait_for(lambda: statuses(tmp_path)[1]["allowed_cpus"] == [0], timeout=10,
                 what="rank 1 follows its taskset", show=lambda: statuses(tmp_path))
        st = statuses(tmp_path)
        assert st[1]["intra_active"] == 1 and st[0]["allowed_cpus"] == [0, 1]
        stop.touch()
        out, _ = proc.communicate(timeout=120)
    finally:
        stop.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("rank ")]
    assert len(lines) == 2, out[-3000:]
    for line in lines:
        f = line.split()
        assert float(f[f.index("last_loss") + 1]) < float(f[f.index("first_loss") + 1]), line
        assert f[f.index("weights_equal") + 1] == "True", line
