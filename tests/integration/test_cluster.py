"""The local mini-cluster and the Slurm client against real slurmctld, slurmd and cgroups."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_plugin import cgroups
from slurm_plugin.cluster import LocalCluster, default_spec
from slurm_plugin.cluster.local import check_port_free
from malleable_protocol.cpulist import parse_cpu_list
from slurm_plugin.slurm import JobState, SignalTarget, UnknownJob

from ..conftest import make_cluster_root
from .helpers import wait_for

pytestmark = pytest.mark.cluster


def job_cpuset(cluster, node: str, uid: int, job_id: int) -> Path:
    return cluster.cgroup_layout(node).cpus_file(uid, job_id)


def test_nodes_report_real_cores(cluster):
    nodes = cluster.client().nodes()
    assert [n.name for n in nodes] == ["tn1", "tn2", "tn3"]
    assert all(n.cpus == os.cpu_count() for n in nodes)


def test_sbatch_n3_core_ids_match_job_cgroups(cluster, tmp_path):
    client = cluster.client()
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsrun sleep 120\n")
    big = client.submit(script, ["-N3", "-n4", f"--output={tmp_path}/big.out"])
    small = client.submit(script, ["-N1", "-n1", f"--output={tmp_path}/small.out"])
    try:
        jobs = wait_for(lambda: (lambda js: js if all(j.state is JobState.RUNNING for j in js)
                                 else None)([client.job(big), client.job(small)]),
                        what="both jobs running")
        seen: dict[str, set[int]] = {}
        for job in jobs:
            assert job.cpu_ids, job
            assert set(job.cpu_ids) == set(job.nodes)
            for node, ids in job.cpu_ids.items():
                # slurmstepd makes the folder, then task/cgroup writes its CPUs: wait for them.
                path = job_cpuset(cluster, node, job.uid, job.job_id)
                wait_for(lambda: path.exists() and parse_cpu_list(path.read_text()) == ids,
                         what=f"{path} = {sorted(ids)}",
                         show=lambda: path.exists() and path.read_text())
                # Slurm never gives one core to two jobs.
                assert not (seen.setdefault(node, set()) & ids)
                seen[node] |= ids
        assert sum(len(ids) for ids in jobs[0].cpu_ids.values()) == 4
        assert set(jobs[0].nodes) == {"tn1", "tn2", "tn3"}
        listed = {j.job_id for j in client.jobs(node=jobs[1].nodes[0])}
        assert small in listed
    finally:
        client.cancel(big)
        client.cancel(small)


def test_comment_signal_and_unknown_job(cluster, tmp_path):
    client = cluster.client()
    script = tmp_path / "trap.sh"
    marker = tmp_path / "got-usr1"
    trapped = tmp_path / "trap-set"
    script.write_text(f"#!/bin/bash\ntrap 'touch {marker}' USR1\ntouch {trapped}\n"
                      "for i in $(seq 600); do sleep 0.1; done\n")
    job_id = client.submit(script, ["-N1", "-n1", f"--output={tmp_path}/out"])
    try:
        wait_for(lambda: client.job(job_id).state is JobState.RUNNING, what="running")
        # RUNNING is Slurm's word from the allocation on; a signal before the script's trap is
        # set ends the shell instead.
        wait_for(trapped.exists, what="the batch script's trap")
        client.set_comment(job_id, "malleable:cpus=2")
        client.set_comment(job_id, "malleable:min=1,max=2", admin=True)
        job = client.job(job_id)
        assert (job.comment, job.admin_comment) == ("malleable:cpus=2", "malleable:min=1,max=2")
        client.signal(job_id, signal.SIGUSR1, SignalTarget.BATCH)
        wait_for(marker.exists, what="the batch shell to get SIGUSR1")
        with pytest.raises(ValueError):
            client.set_comment(job_id, "two\nlines")
        assert client.job(job_id).comment == "malleable:cpus=2"
    finally:
        client.cancel(job_id)
    with pytest.raises(UnknownJob):
        client.job(999999)
    with pytest.raises(UnknownJob):
        client.set_comment(999999, "x")
    with pytest.raises(ValueError):
        client.job("1; rm -rf /")


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurm_plugin.commands.main", *args], capture_output=True,
                          text=True, timeout=180, env=env)


def test_cluster_cli_status_and_env(cluster):
    out = _cli("cluster", "status", "--dir", str(cluster.paths.root))
    assert out.returncode == 0, out.stderr
    assert "daemons: munged=up, slurmctld=up, slurmd tn1=up" in out.stdout
    assert [line.split()[0] for line in out.stdout.splitlines() if line.startswith("tn")] == \
        ["tn1", "tn2", "tn3"]
    env = _cli("cluster", "env", "--dir", str(cluster.paths.root))
    assert env.stdout.splitlines() == [f"export SLURM_CONF={cluster.paths.slurm_conf}",
                                       f"export MALLEABLE_RUN_DIR={cluster.paths.root}/malleable",
                                       f"export MALLEABLE_FEED_DIR={cluster.paths.root}/feed",
                                       "export OMPI_MCA_btl=self,tcp",
                                       "export HOROVOD_CACHE_CAPACITY=0",
                                       "export MALLEABLE_TF_PIN=allowance"]
    # The printed lines point Slurm's own commands at the cluster.
    sinfo = subprocess.run(["bash", "-c", 'eval "$(cat)"; sinfo -h -o %N'], input=env.stdout,
                           capture_output=True, text=True, timeout=30)
    assert sinfo.stdout.strip() == "tn[1-3]"


def test_up_with_port_taken_says_which_port():
    root = make_cluster_root("malleable-port-")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Below the ephemeral ports, which the cluster refuses before it looks whether they
        # are free (test_a_cluster_never_listens_among_linuxs_ephemeral_ports).
        for port in range(22817, 23817, 7):
            try:
                s.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        s.listen()
        out = _cli("cluster", "up", "--dir", str(root), "--port-base", str(port),
                   "--node-prefix", "pt", "--nodes", "1")
    shutil.rmtree(root, ignore_errors=True)
    assert out.returncode == 1
    assert f"port {port} for slurmctld is not free" in out.stderr
    assert f"pid {os.getpid()}" in out.stderr  # names who holds it
    assert not cgroups.made_roots("pt1", multiple_slurmd=True)


def test_up_without_munge_says_so(tmp_path):
    # A PATH on which every Slurm command is found but munged is not.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("munge", "unmunge", "slurmctld", "slurmd", "scontrol", "sinfo", "squeue"):
        (bindir / name).symlink_to(shutil.which(name))
    root = make_cluster_root("malleable-nomunge-")
    out = _cli("cluster", "up", "--dir", str(root), "--port-base", "29817", "--node-prefix", "nm",
               env={**os.environ, "PATH": str(bindir)})
    shutil.rmtree(root, ignore_errors=True)
    assert out.returncode == 1
    assert "munge is not installed: 'munged' not found on PATH" in out.stderr


def test_up_job_down_leaves_no_process_and_no_cgroup():
    root = make_cluster_root("malleable-updown-")
    c = LocalCluster(default_spec(root, nodes=2, port_base=16817, node_prefix="ud"))
    c.up(timeout_s=120)
    try:
        pids = [r.pid for r in c.records()]
        assert len(pids) == 4  # munged, slurmctld, 2 slurmd
        script = root / "job.sh"
        script.write_text("#!/bin/bash\nsrun sleep 300\n")
        job_id = c.client().submit(script, ["-N2", "-n2", f"--output={root}/out"])
        # The step's folder, not only the job's: slurmstepd makes the job folder first (one CI
        # run read step_0 between the two and found nothing).
        def step_tasks(node: str) -> list[int]:
            procs = job_cpuset(c, node, 0, job_id).parent / "step_0" / "cgroup.procs"
            try:
                return [int(p) for p in procs.read_text().split()]
            except FileNotFoundError:
                return []
        wait_for(lambda: all(step_tasks(n) for n in ("ud1", "ud2")), what="step 0's tasks")
        tasks = [p for n in ("ud1", "ud2") for p in step_tasks(n)]
        assert tasks
    finally:
        problems = c.down()
    assert problems == []
    for pid in pids + tasks:
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z", pid
    assert not cgroups.made_roots("ud1", multiple_slurmd=True)
    assert not cgroups.made_roots("ud2", multiple_slurmd=True)
    assert not c.is_running()
    # Down means down: every port is free at once, so an `up` right after cannot race it (a
    # daemon's pid may still show in pgrep for a moment: an exited process, until init reaps it).
    for owner, port in c.spec.ports.items():
        check_port_free(c.spec.address, port)
    shutil.rmtree(root, ignore_errors=True)


def test_horovod_allreduce_across_three_nodes_under_srun_pmix(cluster, tmp_path):
    client = cluster.client()
    script = tmp_path / "hvd.sh"
    out = tmp_path / "hvd.out"
    script.write_text(f"#!/bin/bash\nsrun --mpi=pmix {sys.executable} -m examples.allreduce_check\n")
    job_id = client.submit(script, ["-N3", "-n3", f"--output={out}", "--time=5"])
    job = wait_for(lambda: (lambda j: j if not j.state.holds_cores and j.state is not JobState.PENDING
                            else None)(client.job(job_id)), timeout=240, what="the job to end")
    text = out.read_text()
    assert job.state is JobState.COMPLETED, text
    lines = [line for line in text.splitlines() if line.startswith("rank ")]
    assert len(lines) == 3, text
    assert all("allreduce sum 3 (ok)" in line for line in lines), text
    assert {line.split(" on node ")[1].split()[0] for line in lines} == {"tn1", "tn2", "tn3"}
