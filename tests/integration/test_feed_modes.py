"""Without the feed link, an agent whose feed folder is shared (NFS at a site) looks at the feed
files only every feed_refresh_s; the watcher wakes it with a datagram when it writes the node's
feed. Here the agents and the watcher share one folder (a cluster without the link) and the
agent is told its folder is shared, with a refresh of 60 s: a job that grows, and an
``scontrol update`` that takes effect in seconds, are the wake's doing."""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request

import pytest

from malleable_policy.model import Policy
from slurm_plugin.feed.store import FeedStore

from ..conftest import running_cluster
from .helpers import cgroup_cpus, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def shared_feed_cluster():
    with running_cluster("malleable-shared-", agents=Policy.LEND_IDLE, nodes=2,
                         port_base=13817, node_prefix="sf", name="malleableshared",
                         feed_link=False) as c:
        yield c


def test_an_agent_on_a_shared_feed_is_woken_by_the_watcher(shared_feed_cluster, tmp_path):
    c, node = shared_feed_cluster, "sf1"
    agent_json = c.hooks_dir / "agent.json"
    original = agent_json.read_text()
    settings = json.loads(original)
    settings.update(feed_mode="shared", feed_refresh_s=60.0)
    client = c.client()
    env = {**os.environ, **c.env()}
    job_id = None
    agent_json.write_text(json.dumps(settings))
    try:
        c.restart_agent(node)
        store = FeedStore(c.agent_config().feed_dir)
        wait_for(lambda: store.agent_wake_port(node), timeout=30,
                 what="the agent's wake port registered in the feed")
        script = tmp_path / "job.sh"
        script.write_text("#!/bin/bash\nsleep 300\n")
        job_id = client.submit(script, ["-N1", "-c1", f"-w{node}", "--malleable=1:2",
                                        "-o/dev/null"])
        wait_for(lambda: cgroup_cpus(c, node, job_id) == {0, 1}, timeout=30,
                 what="the job grown into the idle core")
        for cpus, want in ((1, 1), (2, 2)):
            t0 = time.monotonic()
            subprocess.run(["scontrol", "update", f"JobId={job_id}",
                            f"Comment=malleable:cpus={cpus}"], check=True, env=env,
                           capture_output=True)
            wait_for(lambda: len(cgroup_cpus(c, node, job_id) or ()) == want, timeout=20,
                     what=f"cpus={cpus} applied")
            seconds = time.monotonic() - t0
            print(f"\nshared feed: scontrol update cpus={cpus} applied in {seconds * 1000:.0f} ms")
            assert seconds < 10, seconds      # the files are looked at only every 60 s
        # The watcher's own metrics: it polled on the updates' events and sent the wakes. It
        # counts a poll once the poll is over, after the wake it sent: scrape until it has.
        def values():
            scraped = urllib.request.urlopen(
                f"http://127.0.0.1:{c.spec.watcher_metrics_port}/metrics",
                timeout=10).read().decode()
            return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                    for line in scraped.splitlines() if line and not line.startswith("#")}
        wait_for(lambda: (v := values())['malleable_watcher_polls_total{result="ok"}'] >= 3 and
                 v["malleable_watcher_wakes_sent_total"] >= 3 and
                 v["malleable_watcher_event_lag_seconds_count"] >= 2, timeout=10,
                 what="the watcher's counts of its polls, wakes and event lags", show=values)
    finally:
        if job_id is not None:
            client.cancel(job_id)
        agent_json.write_text(original)
        c.restart_agent(node)
