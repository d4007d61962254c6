"""Fixtures of the integration tests that need the co-scheduler."""
from __future__ import annotations

import pytest

from malleable_policy.model import Policy

from ..conftest import running_cluster


@pytest.fixture(scope="module")
def agent_cluster():
    """Two nodes with the Slurm hooks installed and an agent (lend-idle) per node, and Slurm's
    accounting (slurmdbd on MariaDB), where the watcher writes the jobs' borrowed cores."""
    with running_cluster("malleable-agents-", agents=Policy.LEND_IDLE, nodes=2, port_base=11817,
                         node_prefix="an", name="malleableagents", accounting=True) as c:
        yield c
