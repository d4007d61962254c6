"""docs/install.md's steps as packaging/guide.py reads and runs them: the order a site follows,
the site job_submit.lua the guide writes (run in Lua 5.1 with the rendered module, as slurmctld
would), the lines the guide tells a site to merge by hand, and slurm.conf's edit."""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_plugin.commands.doctor import HOOK_KEYS
from slurm_plugin.hooks.install import LUA_MODULE, render_job_submit

REPO = Path(__file__).resolve().parents[3]
GUIDE = REPO / "docs" / "install.md"
LUA = next((p for p in map(shutil.which, ("lua5.1", "lua", "luajit")) if p), None)

_spec = importlib.util.spec_from_file_location("guide", REPO / "packaging" / "guide.py")
guide = importlib.util.module_from_spec(_spec)
sys.modules["guide"] = guide     # dataclasses look their module up there
_spec.loader.exec_module(guide)


def steps() -> dict[str, str]:
    return {s.name: s.script for s in guide.parse_steps(GUIDE.read_text())}


def run_steps(names: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    script = guide.script_for(guide.parse_steps(GUIDE.read_text()), names)
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_guide_has_a_sites_steps_in_order():
    assert list(steps()) == ["settings", "build", "install-package", "configure", "slurm-conf",
                             "job-submit", "restart-slurm", "services", "check"]


def test_a_marker_without_its_block_an_open_block_and_a_repeated_name_are_errors():
    with pytest.raises(guide.GuideError, match="line 1: step 'a' is not followed"):
        guide.parse_steps("<!-- step: a -->\ntext\n")
    with pytest.raises(guide.GuideError, match="not closed"):
        guide.parse_steps("<!-- step: a -->\n```sh\necho\n")
    with pytest.raises(guide.GuideError, match="appears twice"):
        guide.parse_steps("<!-- step: a -->\n```sh\n```\n<!-- step: a -->\n```sh\n```\n")
    with pytest.raises(guide.GuideError, match="no step nope"):
        guide.script_for(guide.parse_steps(GUIDE.read_text()), ["nope"])


def test_settings_come_first_and_the_environment_overrides_them(tmp_path):
    script = guide.script_for(guide.parse_steps(GUIDE.read_text()), ["settings"])
    out = subprocess.run(["bash", "-euo", "pipefail", "-c",
                          script + 'echo "$MALLEABLE_FEED_DIR $MALLEABLE_ETC"'],
                         env={"PATH": "/usr/bin:/bin", "MALLEABLE_FEED_DIR": "/shared/feed"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["/shared/feed", "/etc/malleable"]


def test_slurm_conf_step_adds_the_hooks_once_and_refuses_to_guess(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\n")
    env = {"PATH": "/usr/bin:/bin", "SLURM_ETC": str(tmp_path), "MALLEABLE_ETC": "/etc/m"}
    assert run_steps(["slurm-conf"], env, tmp_path).returncode == 0
    added = dict(line.split("=", 1) for line in conf.read_text().splitlines()[1:]
                 if "=" in line)
    assert set(added) == {"JobSubmitPlugins", *HOOK_KEYS}    # what `malleable doctor` checks
    assert added["Prolog"] == f"{tmp_path}/prolog.d/*"
    assert added["PrologSlurmctld"] == "/etc/m/ctld_event.sh"
    before = conf.read_text()
    again = run_steps(["slurm-conf"], env, tmp_path)
    assert again.returncode == 1 and "merge these lines by hand" in again.stderr
    assert conf.read_text() == before


LUA_DRIVER = r"""
slurm = {SUCCESS = 0, ERROR = -1, log_user = function(...) said = string.format(...) end,
         log_info = function(...) said = string.format(...) end}
assert(dofile(SITE) == slurm.SUCCESS)
local function submit(value)
   said = nil
   local desc = {spank_job_env = {[0] = "MALLEABLE=" .. value}}
   local rc = slurm_job_submit(desc, {}, 1000)
   print(rc, desc.admin_comment or "-", said or "-")
end
submit("1")
submit("x")
local rec = {job_id = 7, user_id = 1000, admin_comment = "malleable:min=1,max=node,weight=1"}
print(slurm_job_modify({comment = "malleable:cpus=2"}, rec, {}, 1000))
print(slurm_job_modify({comment = "maleable:cpus=2"}, rec, {}, 1000))
"""


def test_the_guides_job_submit_lua_runs_the_module(tmp_path):
    assert LUA is not None, "no Lua interpreter: apt-get install lua5.1 (scripts/setup.sh does)"
    etc, slurm_etc = tmp_path / "malleable", tmp_path / "slurm"
    etc.mkdir()
    slurm_etc.mkdir()
    (etc / LUA_MODULE).write_text(render_job_submit(tmp_path / "events", module=True))
    env = {"PATH": "/usr/bin:/bin", "SLURM_ETC": str(slurm_etc), "MALLEABLE_ETC": str(etc)}
    assert run_steps(["job-submit"], env, tmp_path).returncode == 0
    driver = tmp_path / "driver.lua"
    driver.write_text(f"SITE = {str(slurm_etc / 'job_submit.lua')!r}\n" + LUA_DRIVER)
    out = subprocess.run([LUA, str(driver)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    ok, bad, update, typo = out.stdout.splitlines()
    assert ok.split("\t")[:2] == ["0", "malleable:min=1,max=node,weight=1"]
    assert bad.split("\t")[0] == "-1" and "refused --malleable='x'" in bad
    assert (update, typo) == ("0", "-1")
    # The step leaves a site's own script alone.
    (slurm_etc / "job_submit.lua").write_text("-- the site's\n")
    again = run_steps(["job-submit"], env, tmp_path)
    assert again.returncode == 1 and "add the two lines" in again.stderr
    assert (slurm_etc / "job_submit.lua").read_text() == "-- the site's\n"


def test_the_lines_a_site_merges_by_hand_are_the_ones_the_step_writes():
    text = GUIDE.read_text()
    by_hand = re.search(r"```lua\n(.*?)```", text, re.S).group(1)
    step = steps()["job-submit"].replace("$MALLEABLE_ETC", "/etc/malleable")
    added = [line.split("--")[0].strip() for line in by_hand.splitlines() if "malleable" in line]
    assert len(added) == 3
    for line in added:
        assert line in step, line
