"""Shared fixtures. The integration tests run on a real Slurm mini-cluster on this machine."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from slurm_plugin.cluster import LocalCluster, default_spec


def make_cluster_root(prefix: str) -> Path:
    # Not pytest's tmp_path: munged needs every folder above its socket to be traversable by
    # all users, and /tmp/pytest-of-root is private.
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(root, 0o755)
    return root


@pytest.fixture(scope="session")
def cluster():
    """A 3-node cluster for the whole session, on ports and node names of its own."""
    root = make_cluster_root("malleable-test-")
    spec = default_spec(root, nodes=3, port_base=int(os.environ.get("MALLEABLE_TEST_PORT", 27817)),
                        node_prefix="tn", name="malleabletest")
    c = LocalCluster(spec)
    c.up(timeout_s=120)
    try:
        yield c
    finally:
        problems = c.down()
        shutil.rmtree(root, ignore_errors=True)
        assert not problems, problems
