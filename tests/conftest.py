"""Shared fixtures. The integration tests run on real Slurm mini-clusters on this machine."""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from slurm_plugin.cluster import LocalCluster, default_spec


def make_cluster_root(prefix: str) -> Path:
    # Not pytest's tmp_path: munged needs every folder above its socket to be traversable by
    # all users, and /tmp/pytest-of-root is private.
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(root, 0o755)
    return root


@contextmanager
def running_cluster(prefix: str, *, agents: str | None = None, **spec):
    """A cluster up for the block, then down: no process, cgroup folder or file left."""
    root = make_cluster_root(prefix)
    c = LocalCluster(default_spec(root, **spec))
    c.up(timeout_s=120, agents=agents)
    try:
        yield c
    finally:
        problems = c.down()
        shutil.rmtree(root, ignore_errors=True)
        assert not problems, problems


@pytest.fixture(scope="session")
def cluster():
    """A 3-node cluster for the whole session, on ports and node names of its own."""
    with running_cluster("malleable-test-", nodes=3, node_prefix="tn", name="malleabletest",
                         port_base=int(os.environ.get("MALLEABLE_TEST_PORT", 27817))) as c:
        yield c
