"""End to end on Slurm as most sites build it: one slurmd per host, without multiple-slurmd,
so its cgroup folders are not named after the node (cgroup v1), as Debian's build names them.
The build is Debian's own 22.05.8 source built without that option
(scripts/build-slurm-production.sh, cached); the local cluster runs its slurmctld, slurmd and
slurmstepd on one node, with the co-scheduler's hooks and agent as a site installs them."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_plugin import cgroups
from malleable_policy.model import Policy
from slurm_plugin.slurm import JobState

from ..conftest import running_cluster
from ..integration.helpers import (cgroup_cpus, finish, job_cpus_shell, step_records as records,
                                   timeline, wait_for)
from ..integration.invariants import violations

pytestmark = pytest.mark.cluster
TRAIN = Path(__file__).parent.parent / "programs" / "train_until.py"
NODE = "sn1"
SBIN = Path(os.environ.get("MALLEABLE_SITE_SLURM",
                           "/opt/malleable/slurm-production-22.05.8")) / "sbin"


@pytest.fixture(scope="module")
def site_cluster():
    if not (SBIN / "slurmd").is_file():
        pytest.fail(f"no Slurm built without multiple-slurmd in {SBIN}: run "
                    "scripts/build-slurm-production.sh (make test does)")
    with running_cluster("malleable-site-", agents=Policy.LEND_IDLE, nodes=1, port_base=14817,
                         node_prefix="sn", name="malleablesite", slurm_sbin=SBIN) as c:
        yield c
    assert not cgroups.made_roots(NODE, multiple_slurmd=False), \
        cgroups.made_roots(NODE, multiple_slurmd=False)


def test_the_layout_is_discovered_as_the_production_one(site_cluster):
    layout = site_cluster.cgroup_layout(NODE)
    expected = cgroups.SlurmCgroupLayout.named(NODE, cgroups.CgroupVersion.V1,
                                               multiple_slurmd=False)
    assert layout == expected and not layout.multiple_slurmd, layout
    out = subprocess.run([sys.executable, "-m", "slurm_plugin.commands.main", "cgroups", "--node", NODE,
                          "--slurm-conf", str(site_cluster.paths.slurm_conf)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and f"{expected.node_dir()}/uid_<U>" in out.stdout, out


def test_grow_reclaim_step_start_and_resize_on_the_production_layout(site_cluster, tmp_path):
    """A malleable job training in its batch step grows into the idle core and its threads
    follow; a step starts in the grown job (the SPANK plugin); a new job gets its core back
    before its script runs (the Prolog); scontrol update shrinks it; the invariants hold."""
    c, node = site_cluster, NODE
    tmp_path.chmod(0o777)
    stop, go, out = tmp_path / "stop", tmp_path / "go", tmp_path / "a.out"
    env = {**os.environ, **c.env()}
    client = c.client()
    script = tmp_path / "a.sh"
    script.write_text(f"""#!/bin/bash
{sys.executable} {TRAIN} {stop} &
while [ ! -e {go} ]; do sleep 0.1; done
srun -n1 true; echo "step rc=$?"
wait
""")
    a = client.submit(script, ["-N1", "-c1", f"-w{node}", "--comment=malleable:min=1,max=2",
                               f"-o{out}"])
    try:
        wait_for(lambda: (r := records(c, a).get("step_batch")) and r["allowed"] == {0, 1}
                 and r["intra_active"] == 2 and r["steps"] > 0, timeout=180,
                 what="the batch step grown to 2 cores, 2 threads",
                 show=lambda: (timeline(c, node, a), out.read_text()[-1500:]))
        assert cgroup_cpus(c, node, a) == cgroup_cpus(c, node, a, "step_batch") == {0, 1}
        assert not violations(c, node), violations(c, node)
        # Had the agent assumed Debian's layout (slurm_<node>), the running job's real
        # slurmstepd would be found elsewhere: reported (the Prolog then refuses), not silent.
        debian = cgroups.SlurmCgroupLayout.named(node, cgroups.CgroupVersion.V1,
                                                 multiple_slurmd=True)
        stepds = cgroups.slurmstepd_processes()
        assert a in cgroups.misplaced_jobs(debian, [a], stepds), stepds
        assert cgroups.misplaced_jobs(c.cgroup_layout(node), [a], stepds) == {}
        # A step in the grown job: the SPANK plugin brings the job back to its allocation
        # before slurmstepd resets the folder, then the agent grows it again.
        go.touch()
        wait_for(lambda: "step rc=" in out.read_text(), timeout=60, what="the step ran",
                 show=lambda: out.read_text()[-1500:])
        assert "step rc=0" in out.read_text(), out.read_text()[-1500:]
        wait_for(lambda: cgroup_cpus(c, node, a) == {0, 1}, timeout=30, what="A regrown")
        # B arrives: the Prolog takes A's borrowed core back before B's script starts.
        b_out = tmp_path / "b.out"
        cpus_of = functools.partial(job_cpus_shell, node, slurm_conf=c.paths.slurm_conf)
        b_script = tmp_path / "b.sh"
        b_script.write_text("#!/bin/bash\n"
                            f"echo B={cpus_of('$SLURM_JOB_ID')} A={cpus_of(a)}\nsleep 3\n")
        b = client.submit(b_script, ["-N1", "-n1", f"-w{node}", f"-o{b_out}"])
        wait_for(lambda: b_out.exists() and "B=" in b_out.read_text(), timeout=60,
                 what="B started")
        fields = dict(kv.split("=") for kv in b_out.read_text().split())
        assert fields["B"] and fields["A"] and not (set(fields["B"].split(",")) &
                                                    set(fields["A"].split(","))), fields
        wait_for(lambda: (r := records(c, a).get("step_batch")) and r["intra_active"] == 1,
                 timeout=15, what="A's threads down to 1", show=lambda: timeline(c, node, a))
        assert finish(client, b) is JobState.COMPLETED
        wait_for(lambda: cgroup_cpus(c, node, a) == {0, 1}, timeout=30, what="A grown back")
        # The owner asks for one core: A shrinks, its threads follow.
        subprocess.run(["scontrol", "update", f"JobId={a}", "Comment=malleable:cpus=1"],
                       check=True, env=env, capture_output=True)
        wait_for(lambda: (r := records(c, a)["step_batch"]) and len(r["allowed"]) == 1 and
                 r["intra_active"] == 1, timeout=15, what="shrunk to 1 core, 1 thread",
                 show=lambda: timeline(c, node, a))
        assert len(cgroup_cpus(c, node, a)) == 1
        assert not violations(c, node), violations(c, node)
        stop.touch()
        assert finish(client, a) is JobState.COMPLETED, out.read_text()[-2000:]
    finally:
        stop.touch()
        go.touch()
        client.cancel(a)
