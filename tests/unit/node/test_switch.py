"""The site's kill switch (``switch.py``): the setting, the file ``malleable disable`` leaves,
and the cycle deciding with every job held to its allocation while it is thrown."""
import os

import pytest

from slurm_plugin.node.config import AgentConfig
from slurm_plugin.node.switch import switch_off, switch_on, switched_off


def config(tmp_path, **kw) -> AgentConfig:
    return AgentConfig(node="n1", state_dir=tmp_path / "state", run_dir=tmp_path / "run", **kw)


def test_the_setting_and_the_command_both_switch_it_off(tmp_path):
    assert switched_off(config(tmp_path)) is None
    assert "agent.json" in switched_off(config(tmp_path, enabled=False))
    c = config(tmp_path)
    switch_off(c, "maintenance until 14:00")
    assert switched_off(c).endswith(": maintenance until 14:00")
    assert (os.stat(c.switch_file).st_mode & 0o777) == 0o600
    assert switch_on(c) and switched_off(c) is None and not switch_on(c)


def test_a_switch_file_that_cannot_be_read_counts_as_off(tmp_path):
    c = config(tmp_path)
    c.state_dir.mkdir()
    c.switch_file.mkdir()               # not a file: open() fails (EISDIR on read)
    assert switched_off(c) is not None
    c.switch_file.rmdir()
    c.switch_file.symlink_to("/etc/passwd")       # never followed
    assert "cannot be read" in switched_off(c)


def test_enabled_must_be_a_boolean():
    with pytest.raises(ValueError, match="enabled"):
        AgentConfig(node="n1", enabled="no")
