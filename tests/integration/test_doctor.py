"""``malleable doctor`` on a real node of the agents' cluster: every check passes; with the
node's agent stopped, the agent check fails and the command exits 1."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from slurm_plugin.cluster import daemons

from .helpers import wait_for

pytestmark = pytest.mark.cluster


def doctor(c, node: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurm_plugin.commands.main", "doctor", "--config",
                           str(c.hooks_dir / "agent.json"), "--node", node],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **c.env()})


def test_doctor_passes_a_working_node_and_names_a_stopped_agent(agent_cluster):
    c = agent_cluster
    # Right after the cluster starts the watcher may not have published yet, nor the agent
    # made its socket, nor the feed link brought a node its first copy: doctor says so until
    # they have, on each node (an2's too, before its agent is stopped: on a busy machine its
    # first copy of the feed came after an1's was checked, 2026-12-07).
    last = []

    def all_ok(node: str) -> bool:
        last[:] = [doctor(c, node)]
        lines = last[0].stdout.splitlines()
        return last[0].returncode == 0 and len(lines) >= 10 and \
            all(line.startswith("ok") for line in lines)
    for node in ("an1", "an2"):
        wait_for(lambda: all_ok(node), timeout=60, what=f"every check ok on {node}",
                 show=lambda: last[0].stdout + last[0].stderr)
    out = last[0]
    print("\n" + out.stdout)
    agent = next(r for r in c.records() if r.name == "agent an2")
    daemons.stop_daemon(agent)
    try:
        out = doctor(c, "an2")
        assert out.returncode == 1, out.stdout + out.stderr
        assert [line.split()[1] for line in out.stdout.splitlines()
                if line.startswith("FAIL")] == ["agent"], out.stdout
        assert "1 check(s) failed: agent" in out.stderr
    finally:
        c.restart_agent("an2")
