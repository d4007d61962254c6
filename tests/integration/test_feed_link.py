"""The feed link on the local cluster (issue 41): each node's agent keeps a folder of its own,
filled over TCP from the watcher (munge proves both ends are root), as on a site without a
shared file system. Everything on a node (agent, Prolog, Epilog, step start) reads only that
folder, so a watcher that stops answering holds up no job's launch."""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time

import pytest

from malleable_policy.model import Policy
from slurm_plugin.feed.store import FeedStore

from ..conftest import running_cluster
from .helpers import cgroup_cpus, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def link_cluster():
    with running_cluster("malleable-link-", agents=Policy.LEND_IDLE, nodes=2, port_base=12817,
                         node_prefix="ln", name="malleablelink", feed_link=True) as c:
        yield c


def _node_store(c, node: str) -> FeedStore:
    return FeedStore(c.paths.root / "node-feed" / node)


def _watcher_pid(c) -> int:
    return next(r.pid for r in c.records() if r.name == "watcher")


def test_jobs_grow_shrink_and_are_accounted_over_the_link(link_cluster, tmp_path):
    c = link_cluster
    client = c.client()
    env = {**os.environ, **c.env()}
    watcher = FeedStore(c.paths.root / "feed")
    for node in c.spec.node_names:
        wait_for(lambda: _node_store(c, node).read_node(node) is not None, timeout=30,
                 what=f"{node}'s feed in its own folder")
    # No agent registered a wake port: the link is the only way the feed reaches a node.
    assert not watcher.agents_dir.exists() or not os.listdir(watcher.agents_dir)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsleep 300\n")
    one = client.submit(script, ["-N1", "-c1", "-wln1", "--malleable=1:2", "-o/dev/null"])
    two = None
    try:
        wait_for(lambda: cgroup_cpus(c, "ln1", one) == {0, 1}, timeout=30,
                 what="the job grown into the idle core")
        for cpus in (1, 2):
            t0 = time.monotonic()
            subprocess.run(["scontrol", "update", f"JobId={one}",
                            f"Comment=malleable:cpus={cpus}"], check=True, env=env,
                           capture_output=True)
            wait_for(lambda: len(cgroup_cpus(c, "ln1", one) or ()) == cpus, timeout=20,
                     what=f"cpus={cpus} applied")
            print(f"\nfeed link: scontrol update cpus={cpus} applied in "
                  f"{(time.monotonic() - t0) * 1000:.0f} ms")
        # The node's report reaches the watcher's folder (malleable status reads it there).
        wait_for(lambda: (r := watcher.read_report("ln1")) is not None and
                 any(j.job_id == one for j in r.jobs), timeout=20,
                 what="ln1's report at the watcher")
        # A two-node job: each node's offers reach the other's folder, and only through the
        # watcher (the folders are apart).
        client.cancel(one)
        both = tmp_path / "both.sh"
        both.write_text("#!/bin/bash\nsrun sleep 300\n")      # a step (and a folder) on each
        two = client.submit(both, ["-N2", "-n2", "--ntasks-per-node=1", "-c1",
                                   "--malleable=1:2", "-o/dev/null"])
        wait_for(lambda: (o := _node_store(c, "ln1").read_offers("ln2")) is not None and
                 two in o.per_rank, timeout=30, what="ln2's offer for the job on ln1")
        wait_for(lambda: (o := _node_store(c, "ln2").read_offers("ln1")) is not None and
                 two in o.per_rank, timeout=30, what="ln1's offer for the job on ln2")
        client.cancel(two)
        # Each node leaves the job's usage in its own folder (the Epilog, or the agent when
        # the job's folder went first, as after scancel); the link hands it to the watcher,
        # which closes the job once every node's is in.
        wait_for(lambda: any(json.loads(line).get("job") == two for line in
                             (watcher.usage_log.read_text().splitlines()
                              if watcher.usage_log.exists() else [])),
                 timeout=60, what="the two-node job's usage closed by the watcher",
                 show=lambda: (os.listdir(watcher.usage_dir),
                               [os.listdir(_node_store(c, n).usage_dir)
                                for n in c.spec.node_names]))
        for node in c.spec.node_names:
            assert _node_store(c, node).usage_files() == {}
    finally:
        for job in (one, two):
            if job is not None:
                client.cancel(job)


RIGID = """#!/bin/bash
for i in 1 2 3; do
  s=$EPOCHREALTIME; srun -n1 true; rc=$?; e=$EPOCHREALTIME
  echo "step rc=$rc seconds=$(awk "BEGIN{print $e - $s}")"
done
echo "started $(cat {stamp})"
"""


def _rigid_round(c, tmp_path, tag: str, jobs: int) -> dict[str, list[float]]:
    """``jobs`` rigid jobs one after another: sbatch's own time, submit to the job's first
    line, and each srun's launch. Returns the samples."""
    env = {**os.environ, **c.env()}
    out: dict[str, list[float]] = {"submit": [], "start": [], "step": []}
    for i in range(jobs):
        stamp = tmp_path / f"{tag}{i}.stamp"
        script = tmp_path / f"{tag}{i}.sh"
        script.write_text(RIGID.replace("{stamp}", str(stamp)).replace(
            "#!/bin/bash\n", f"#!/bin/bash\necho $EPOCHREALTIME > {stamp}\n", 1))
        log = tmp_path / f"{tag}{i}.out"
        t0 = time.time()
        job = subprocess.run(["sbatch", "--parsable", "-N1", "-c1", "-wln2", f"-o{log}",
                              str(script)], env=env, check=True, capture_output=True,
                             text=True).stdout.strip().split(";")[0]
        out["submit"].append(time.time() - t0)
        wait_for(lambda: "started" in (log.read_text() if log.exists() else ""), timeout=60,
                 what=f"rigid job {job} ({tag}) done", show=lambda: log.read_text()
                 if log.exists() else "")
        text = log.read_text()
        assert text.count("step rc=0") == 3, text
        out["start"].append(float(stamp.read_text()) - t0)
        out["step"] += [float(line.split("seconds=")[1]) for line in text.splitlines()
                        if line.startswith("step rc=0")]
    return out


def test_a_frozen_watcher_holds_up_no_launch(link_cluster, tmp_path):
    """The watcher stopped (SIGSTOP: its connections stay open and unread, as with a host
    that hangs): jobs are still submitted, start and launch steps; the nodes keep their last
    feed. The times of both rounds are printed side by side (benchmarks/cluster/
    feed_link_hung.py measures them over more jobs)."""
    c = link_cluster
    healthy = _rigid_round(c, tmp_path, "healthy", 3)
    pid = _watcher_pid(c)
    os.kill(pid, signal.SIGSTOP)
    try:
        frozen = _rigid_round(c, tmp_path, "frozen", 3)
        feed = _node_store(c, "ln2").read_node("ln2")
        assert feed is not None            # the last feed stays on the node
    finally:
        os.kill(pid, signal.SIGCONT)
    for what in ("submit", "start", "step"):
        print(f"\n{what}: p50 healthy {statistics.median(healthy[what]) * 1000:.0f} ms, "
              f"watcher frozen {statistics.median(frozen[what]) * 1000:.0f} ms")
