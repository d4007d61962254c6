"""docs/install.md's steps as packaging/guide.py reads and runs them: the order a site follows,
the site job_submit.lua the guide writes (run in Lua 5.1 with the rendered module, as slurmctld
would), the lines the guide tells a site to merge by hand, and the slurm.conf lines it writes for an
Include (never slurm.conf itself)."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_plugin.hooks.slurm_conf import HOOK_KEYS
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
                             "job-submit", "restart-slurm", "services", "check",
                             "upgrade-begin", "upgrade-end", "uninstall-return", "uninstall-unhook",
                             "uninstall-remove"]


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


def fake_commands(folder: Path, show_config: str) -> dict[str, str]:
    """An environment whose systemctl says slurmctld runs, whose scontrol prints
    ``show_config``, and whose malleable is this checkout's: the step's own commands, with
    Slurm played (the VM cluster runs them against a real slurmctld)."""
    folder.mkdir()
    (folder / "config.txt").write_text(show_config)
    scripts = {"systemctl": "exit 0",
               "scontrol": f'cat {folder / "config.txt"}',
               "malleable": f'PYTHONPATH={REPO} exec {sys.executable} -m '
                            'slurm_plugin.commands.main "$@"'}
    for name, body in scripts.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return {"PATH": f"{folder}:/usr/bin:/bin"}


def test_slurm_conf_step_writes_an_include_file_and_never_slurm_conf(tmp_path):
    slurm_etc = tmp_path / "slurm"
    slurm_etc.mkdir()
    conf = slurm_etc / "slurm.conf"
    conf.write_text("ClusterName=c\nInclude site.conf\n")
    show = "SLURM_VERSION           = 22.05.8\nProlog                  = (null)\n"
    env = {**fake_commands(tmp_path / "bin", show), "SLURM_ETC": str(slurm_etc),
           "MALLEABLE_ETC": "/etc/m"}
    out = run_steps(["slurm-conf"], env, tmp_path)
    assert out.returncode == 0, out.stderr
    added = dict(line.split("=", 1) for line in (slurm_etc / "malleable.conf").read_text()
                 .splitlines() if "=" in line and not line.startswith("#"))
    assert set(added) == {"JobSubmitPlugins", *HOOK_KEYS}    # what `malleable doctor` checks
    assert added["Prolog"] == f"{slurm_etc}/prolog.d/*"
    assert added["PrologSlurmctld"] == "/etc/m/ctld_event.sh"
    assert "Include malleable.conf" in out.stdout
    assert conf.read_text() == "ClusterName=c\nInclude site.conf\n"


def test_slurm_conf_step_stops_where_a_prolog_must_be_chained_by_hand(tmp_path):
    slurm_etc = tmp_path / "slurm"
    slurm_etc.mkdir()
    show = "SLURM_VERSION           = 23.11.9\nProlog                  = /site/prolog.sh\n"
    env = {**fake_commands(tmp_path / "bin", show), "SLURM_ETC": str(slurm_etc),
           "MALLEABLE_ETC": "/etc/m"}
    out = run_steps(["slurm-conf"], env, tmp_path)
    assert out.returncode == 1 and "need a hand: Prolog" in out.stderr
    assert "ln -s /site/prolog.sh" in out.stdout


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
    env = {**fake_commands(tmp_path / "bin", ""), "SLURM_ETC": str(slurm_etc),
           "MALLEABLE_ETC": str(etc)}
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
    # A site's own that calls ours is kept, and touched: slurmctld reloads Lua on a new mtime.
    own = "-- the site's\nlocal malleable = dofile('/etc/malleable/job_submit_malleable.lua')\n"
    (slurm_etc / "job_submit.lua").write_text(own)
    os.utime(slurm_etc / "job_submit.lua", (1, 1))
    kept = run_steps(["job-submit"], env, tmp_path)
    assert kept.returncode == 0 and "kept, touched" in kept.stderr
    assert (slurm_etc / "job_submit.lua").read_text() == own
    assert (slurm_etc / "job_submit.lua").stat().st_mtime > 1
    # Ours is written again (a new version's), its time new too.
    (slurm_etc / "job_submit.lua").unlink()
    assert run_steps(["job-submit"], env, tmp_path).returncode == 0
    first = (slurm_etc / "job_submit.lua").read_text()
    assert run_steps(["job-submit"], env, tmp_path).returncode == 0
    assert (slurm_etc / "job_submit.lua").read_text() == first
    # A host without slurmctld gets none.
    (slurm_etc / "job_submit.lua").unlink()
    (tmp_path / "bin" / "systemctl").write_text("#!/bin/sh\nexit 3\n")
    assert run_steps(["job-submit"], env, tmp_path).returncode == 0
    assert not (slurm_etc / "job_submit.lua").exists()


def test_the_lines_a_site_merges_by_hand_are_the_ones_the_step_writes():
    text = GUIDE.read_text()
    by_hand = re.search(r"```lua\n(.*?)```", text, re.S).group(1)
    step = steps()["job-submit"].replace("$MALLEABLE_ETC", "/etc/malleable")
    added = [line.split("--")[0].strip() for line in by_hand.splitlines() if "malleable" in line]
    assert len(added) == 3
    for line in added:
        assert line in step, line


def configured_node(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A node's Slurm folder with a slurm.conf, our folder, and the environment the steps
    configure and uninstall-unhook run in: install-slurm-hooks played (it makes its folder; the
    VM cluster runs the real one), systemctl saying nothing runs once configure is done."""
    slurm_etc, etc = tmp_path / "slurm", tmp_path / "malleable"
    slurm_etc.mkdir()
    (slurm_etc / "slurm.conf").write_text("ClusterName=c\n")
    env = {**fake_commands(tmp_path / "bin", ""), "SLURM_ETC": str(slurm_etc),
           "MALLEABLE_ETC": str(etc), "MALLEABLE_WATCHER_HOSTS": "ctl"}
    (tmp_path / "bin" / "malleable").write_text('#!/bin/sh\nmkdir -p "$2"\n')
    return slurm_etc, etc, env


def configure_twice_then_unhook(tmp_path: Path, env: dict[str, str], between=lambda: None
                                ) -> subprocess.CompletedProcess:
    """Step configure twice (a second adds nothing more), ``between()``, then uninstall-unhook
    with nothing running."""
    for _ in range(2):
        out = run_steps(["configure"], env, tmp_path)
        assert out.returncode == 0, out.stderr
    between()
    (tmp_path / "bin" / "systemctl").write_text("#!/bin/sh\nexit 3\n")
    out = run_steps(["uninstall-unhook"], env, tmp_path)
    assert out.returncode == 0, out.stderr
    return out


def test_configure_notes_the_folders_it_makes_and_the_uninstall_removes_only_those(tmp_path):
    """Debian's slurm-wlm-basic-plugins ships plugstack.conf.d: configure makes prolog.d and
    epilog.d only, and the uninstall leaves the package's folder where it was."""
    slurm_etc, etc, env = configured_node(tmp_path)
    (slurm_etc / "plugstack.conf.d").mkdir()

    def made():
        assert (etc / "folders-made").read_text().split() == [f"{slurm_etc}/prolog.d",
                                                              f"{slurm_etc}/epilog.d"]
        assert (slurm_etc / "prolog.d" / "50-malleable").is_symlink()
    configure_twice_then_unhook(tmp_path, env, made)
    left = sorted(str(p.relative_to(slurm_etc)) for p in slurm_etc.rglob("*"))
    assert left == ["plugstack.conf.d", "slurm.conf"], left


INCLUDE_LINE = "include {etc}/plugstack.conf.d/*.conf\n"


@pytest.mark.parametrize("before, after_configure", [
    # SchedMD's packages ship no /etc/slurm: configure makes plugstack.conf, the uninstall
    # removes it.
    (None, INCLUDE_LINE),
    # A site's own without the line: it is appended, then taken out again, byte for byte.
    ("optional /usr/lib/x.so\n\n", "optional /usr/lib/x.so\n\n" + INCLUDE_LINE),
    # Its last line without a newline: ours goes on a line of its own.
    ("optional /usr/lib/x.so", "optional /usr/lib/x.so\n" + INCLUDE_LINE),
    # Debian's has the line already: nothing is added, nothing taken out.
    (INCLUDE_LINE, INCLUDE_LINE)], ids=["none", "the-sites", "no-last-newline", "debians"])
def test_configure_adds_the_plugstack_include_line_once_and_the_uninstall_takes_it_out(
        tmp_path, before, after_configure):
    slurm_etc, etc, env = configured_node(tmp_path)
    stack = slurm_etc / "plugstack.conf"
    if before is not None:
        stack.write_text(before.format(etc=slurm_etc))

    def configured():
        assert stack.read_text() == after_configure.format(etc=slurm_etc)
    configure_twice_then_unhook(tmp_path, env, configured)
    if before is None:
        assert not stack.exists()
    else:       # the file without its last newline gets one back: the line was made whole
        assert stack.read_text() == before.format(etc=slurm_etc) + (
            "\n" if not before.endswith("\n") else "")
    assert not (etc / "plugstack-include-added").exists()


def test_the_include_line_stays_while_another_plugin_needs_it(tmp_path):
    slurm_etc, etc, env = configured_node(tmp_path)

    def pyxis_installed_after_us():     # relying on the line we added
        (slurm_etc / "plugstack.conf.d" / "pyxis.conf").write_text("required spank_pyxis.so\n")
    out = configure_twice_then_unhook(tmp_path, env, pyxis_installed_after_us)
    assert "include line is left" in out.stderr
    assert (slurm_etc / "plugstack.conf").read_text() == INCLUDE_LINE.format(etc=slurm_etc)
    assert (slurm_etc / "plugstack.conf.d" / "pyxis.conf").exists()
    assert not (slurm_etc / "plugstack.conf.d" / "malleable.conf").exists()


def test_uninstall_unhook_removes_only_ours_and_waits_for_the_include_line(tmp_path):
    slurm_etc, etc = tmp_path / "slurm", tmp_path / "malleable"
    for d in (slurm_etc / "prolog.d", slurm_etc / "epilog.d", slurm_etc / "plugstack.conf.d",
              etc):
        d.mkdir(parents=True)
    # configure made prolog.d and epilog.d; plugstack.conf.d is the site's (its packages').
    (etc / "folders-made").write_text(f"{slurm_etc}/prolog.d\n{slurm_etc}/epilog.d\n")
    (slurm_etc / "prolog.d" / "50-malleable").symlink_to(etc / "prolog.sh")
    (slurm_etc / "prolog.d" / "10-site").symlink_to("/opt/site/prolog.sh")
    (slurm_etc / "epilog.d" / "50-malleable").symlink_to(etc / "epilog.sh")
    (slurm_etc / "plugstack.conf.d" / "malleable.conf").symlink_to(etc / "plugstack.conf")
    (slurm_etc / "malleable.conf").write_text("Prolog=x\n")
    (slurm_etc / "slurm.conf").write_text("ClusterName=c\nInclude malleable.conf\n")
    env = {**fake_commands(tmp_path / "bin", ""), "SLURM_ETC": str(slurm_etc),
           "MALLEABLE_ETC": str(etc)}
    (tmp_path / "bin" / "systemctl").write_text("#!/bin/sh\nexit 3\n")   # nothing running
    refused = run_steps(["uninstall-unhook"], env, tmp_path)
    assert refused.returncode == 1 and "still Includes malleable.conf" in refused.stderr
    assert (slurm_etc / "malleable.conf").exists()              # nothing removed yet
    assert (slurm_etc / "prolog.d" / "50-malleable").is_symlink()
    (slurm_etc / "slurm.conf").write_text("ClusterName=c\n")
    assert run_steps(["uninstall-unhook"], env, tmp_path).returncode == 0
    left = sorted(str(p.relative_to(slurm_etc)) for p in slurm_etc.rglob("*"))
    assert left == ["plugstack.conf.d", "prolog.d", "prolog.d/10-site", "slurm.conf"], left
