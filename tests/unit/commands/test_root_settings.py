"""The root side's environment, parsed in one place (slurm_plugin.settings): defaults, each
variable, and a bad value refused with one error that names it."""
import subprocess
import sys
from pathlib import Path

import pytest

from malleable_protocol.errors import FixableError
from slurm_plugin.settings import (DEFAULT_CLUSTER_DIR, RootSettings,
                                   SettingsError, cluster_dir)

ROOT = Path(__file__).resolve().parents[3]


def test_an_empty_environment_gives_the_defaults():
    s = RootSettings.from_env({})
    assert s == RootSettings()
    assert (s.node, s.slurm_conf, s.feed_dir, s.state_dir, s.cluster_dir, s.cc) == \
        (None, None, None, None, DEFAULT_CLUSTER_DIR, "gcc")


def test_each_variable_is_read():
    s = RootSettings.from_env({
        "SLURMD_NODENAME": "n1", "SLURM_NODENAME": "n2", "SLURM_CONF": "/etc/s/slurm.conf",
        "MALLEABLE_FEED_DIR": "/f", "MALLEABLE_STATE_DIR": "/s",
        "MALLEABLE_CLUSTER_DIR": "/c", "CC": "clang"})
    assert (s.slurmd_node, s.job_node, s.node) == ("n1", "n2", "n1")   # slurmd's first
    assert (s.slurm_conf, s.feed_dir, s.state_dir, s.cluster_dir, s.cc) == \
        (Path("/etc/s/slurm.conf"), Path("/f"), Path("/s"), Path("/c"), "clang")
    assert RootSettings.from_env({"SLURM_NODENAME": "n2"}).node == "n2"
    assert cluster_dir({"MALLEABLE_CLUSTER_DIR": "/c", "SLURMD_NODENAME": "../x"}) == Path("/c")


@pytest.mark.parametrize("name,value", [
    ("SLURMD_NODENAME", "../etc"), ("SLURMD_NODENAME", "a/b"), ("SLURM_NODENAME", ".."),
    ("CC", "ccache gcc"), ("MALLEABLE_FEED_DIR", "/a\nb"), ("SLURM_CONF", "x\ny")])
def test_a_bad_value_is_one_error_naming_the_variable(name, value):
    with pytest.raises(SettingsError, match=name) as caught:
        RootSettings.from_env({name: value})
    assert isinstance(caught.value, FixableError)


def test_the_command_says_which_variable_in_one_line():
    done = subprocess.run([sys.executable, "-m", "slurm_plugin.commands.main", "status"],
                          env={"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "../etc"},
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [
        "malleable: SLURMD_NODENAME must be a Slurm node name, not '../etc'"]
