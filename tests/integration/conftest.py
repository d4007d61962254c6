"""Fixtures of the integration tests that need the co-scheduler."""
from __future__ import annotations

import shutil

import pytest

from slurm_plugin.cluster import LocalCluster, default_spec

from ..conftest import make_cluster_root


@pytest.fixture(scope="module")
def agent_cluster():
    root = make_cluster_root("malleable-agents-")
    c = LocalCluster(default_spec(root, nodes=2, port_base=37817, node_prefix="an",
                                  name="malleableagents"))
    c.up(timeout_s=120, agents="lend-idle")
    try:
        yield c
    finally:
        problems = c.down()
        shutil.rmtree(root, ignore_errors=True)
        assert not problems, problems
