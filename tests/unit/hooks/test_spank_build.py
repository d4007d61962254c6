"""The SPANK plugin builds against the installed Slurm headers, and says what is missing."""
import subprocess

import pytest

from slurm_plugin.hooks import spank


def test_the_plugin_builds_and_exports_what_slurmstepd_looks_up(tmp_path):
    lib = spank.build(tmp_path)
    assert lib == tmp_path / spank.LIBRARY and lib.stat().st_mode & 0o755 == 0o755
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                             text=True, check=True).stdout.split()
    for name in ("slurm_spank_init", "plugin_name", "plugin_type", "plugin_version"):
        assert name in symbols
    assert [p.name for p in tmp_path.iterdir()] == [spank.LIBRARY]      # no temporary left


def test_a_missing_compiler_or_header_is_named(tmp_path):
    with pytest.raises(spank.SpankBuildError, match="apt-get install gcc"):
        spank.build(tmp_path, compiler="no-such-cc")
    with pytest.raises(spank.SpankBuildError, match="libslurm-dev"):
        spank.build(tmp_path, include=tmp_path / "nowhere")
    assert not any(tmp_path.iterdir())


def test_plugstack_line_names_the_hook_and_its_settings(tmp_path):
    line = spank.plugstack_line(tmp_path / "m.so", python="/opt/v/bin/python",
                                config=tmp_path / "agent.json", state_dir=tmp_path / "agent")
    assert line == (f"required {tmp_path}/m.so python=/opt/v/bin/python "
                    f"config={tmp_path}/agent.json state={tmp_path}/agent timeout=20\n")
