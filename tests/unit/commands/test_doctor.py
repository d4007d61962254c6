"""``malleable doctor``'s verdicts from what a node has (diagnose is pure); the real node is
checked in tests/integration/test_feed_modes.py."""
from __future__ import annotations

from pathlib import Path

from slurm_plugin.commands.doctor import (Facts, Status, _plugstack_lines, diagnose,
                                          plugstack_path, render)
from slurm_plugin.hooks.slurm_conf import HOOK_KEYS, hook_runs_ours, runs_ours
from slurm_plugin.settings import CONFIGLESS_SLURM_CONF, local_slurm_conf
from slurm_plugin.hooks.install import render_hook
from slurm_plugin.slurm.parsers import parse_config_values

FIX = Path(__file__).resolve().parents[2] / "fixtures"


def healthy() -> Facts:
    config = (FIX / "slurm-22.05" / "scontrol_show_config_slurmdbd.txt").read_text()
    config = config.replace("JobSubmitPlugins        = (null)", "JobSubmitPlugins        = lua")
    return Facts(node="n1", slurm_config=config,
                 hooks={k: (f"/etc/slurm/{k}.sh", True) for k in HOOK_KEYS},
                 layout="cgroup v1, /sys/fs/cgroup/cpuset/slurm/uid_<U>/job_<J>",
                 numbering="2 sockets x 8 cores x 1 threads; Slurm's CPU ids abstract->Linux "
                           "0->0, 1->2, ...", cpu_layout=[2, 8, 1],
                 plugstack_lines=["required /usr/lib/malleable/malleable_spank.so python=x"],
                 spank_so_exists=True, agent_pid=42, step_socket=True,
                 feed_mode="local (ext4)", feed_file={"jobs": [{}, {}], "layout": [2, 8, 1]},
                 feed_age_s=3.0)


def statuses(f: Facts) -> dict[str, Status]:
    return {c.name: c.status for c in diagnose(f)}


def test_a_healthy_node_passes_every_check():
    checks = diagnose(healthy())
    assert all(c.status is Status.OK for c in checks), render(checks)
    assert {c.name for c in checks} >= {"slurmctld", "Prolog", "Epilog", "SPANK plugin",
                                        "cgroup layout", "CPU numbering", "agent", "feed",
                                        "feed mode"}


def test_each_missing_part_fails_its_own_check_only():
    cases = {
        "agent": dict(agent_pid=None),
        "Prolog": dict(hooks={**healthy().hooks, "Prolog": ("/etc/slurm/site.sh", False)}),
        "SPANK plugin": dict(spank_so_exists=False),
        "cgroup layout": dict(layout=None),
        "CPU numbering": dict(numbering=None, cpu_layout=None),
        "feed": dict(feed_file=None),
        "feed mode": dict(feed_mode="shared (nfs4)", wake_port=None),
        "JobSubmitPlugins": dict(slurm_config=healthy().slurm_config.replace(
            "JobSubmitPlugins        = lua", "JobSubmitPlugins        = (null)")),
    }
    for name, change in cases.items():
        f = healthy()
        for k, v in change.items():
            setattr(f, k, v)
        failed = {n for n, s in statuses(f).items() if s is Status.FAIL}
        assert failed == {name}, (name, failed)


def test_the_cpu_numbering_check_says_what_slurm_and_the_node_disagree_on():
    f = healthy()
    f.feed_file = {**f.feed_file, "layout": [1, 32, 1]}      # hyperthreads counted as cores
    check = next(c for c in diagnose(f) if c.name == "CPU numbering")
    assert check.status is Status.FAIL and "slurmd -C" in check.detail


def test_on_hyperthreaded_nodes_the_check_says_whether_slurm_allocates_cores_or_threads():
    def check_with(select: str | None):
        f = healthy()
        f.cpu_layout, f.feed_file = [2, 8, 2], {**f.feed_file, "layout": [2, 8, 2]}
        lines = [ln for ln in f.slurm_config.splitlines()
                 if not ln.startswith("SelectTypeParameters")]
        if select is not None:
            lines.append(f"SelectTypeParameters    = {select}")
        f.slurm_config = "\n".join(lines)
        return next(c for c in diagnose(f) if c.name == "CPU numbering")
    for whole in ("CR_CORE_MEMORY", "CR_Core", "CR_SOCKET,CR_PACK_NODES"):
        check = check_with(whole)
        assert check.status is Status.OK and "allocates whole cores" in check.detail, whole
    check = check_with("CR_CPU_MEMORY")     # threads declared: no core to two jobs either
    assert check.status is Status.OK and "CR_CPU with ThreadsPerCore" in check.detail
    check = check_with(None)
    assert check.status is Status.WARN and "unknown" in check.detail


def test_no_slurmctld_fails_and_a_commented_plugin_line_does_not_count():
    f = healthy()
    f.slurm_config, f.errors = None, {"slurm": "scontrol: Unable to contact slurm controller"}
    assert statuses(f)["slurmctld"] is Status.FAIL
    f = healthy()
    f.plugstack_lines = ["# required /usr/lib/malleable/malleable_spank.so"]
    assert statuses(f)["SPANK plugin"] is Status.FAIL


def test_a_chained_site_hook_counts_and_includes_are_followed(tmp_path):
    assert runs_ours("#!/bin/sh\n/etc/slurm/site-prolog\nexec /usr/lib/malleable/prolog.sh\n")
    assert not runs_ours("#!/bin/sh\n/etc/slurm/site-prolog\n")
    (tmp_path / "plugstack.conf.d").mkdir()
    (tmp_path / "plugstack.conf.d" / "malleable.conf").write_text(
        "required /opt/m/malleable_spank.so\n")
    (tmp_path / "plugstack.conf").write_text(
        f"optional /usr/lib/pyxis.so\ninclude {tmp_path}/plugstack.conf.d/*.conf\n")
    assert _plugstack_lines(tmp_path / "plugstack.conf") == [
        "optional /usr/lib/pyxis.so", "required /opt/m/malleable_spank.so"]


def test_hook_programs_of_both_slurm_versions_and_none():
    v22 = "Prolog                  = /etc/slurm/prolog.d/*\nPrologFlags             = (null)\n"
    v24 = ("Prolog[0]               = /etc/slurm/site-prolog\n"
           "Prolog[1]               = /etc/slurm/prolog.d/*\nPrologEpilogTimeout = 65534\n"
           "Epilog                  = (null)\n")
    assert parse_config_values(v22, "Prolog") == ["/etc/slurm/prolog.d/*"]
    assert parse_config_values(v24, "Prolog") == ["/etc/slurm/site-prolog", "/etc/slurm/prolog.d/*"]
    assert parse_config_values(v24, "Epilog") == []
    assert parse_config_values(v24, "PrologSlurmctld") == []


def test_a_prolog_glob_counts_when_one_of_its_programs_runs_ours(tmp_path):
    folder = tmp_path / "prolog.d"
    folder.mkdir()
    (folder / "10-site").write_text("#!/bin/sh\ntrue\n")
    ours = tmp_path / "malleable-prolog.sh"
    ours.write_text(render_hook("prolog.sh", python="/usr/bin/python3",
                                config=Path("/etc/malleable/agent.json"),
                                state_dir=Path("/run/malleable/agent")))
    assert hook_runs_ours([f"{folder}/*"]) == (f"{folder}/*", False)
    (folder / "50-malleable").symlink_to(ours)
    shown, found = hook_runs_ours([str(tmp_path / "missing"), f"{folder}/*"])
    assert found and shown.endswith(f"({folder}/50-malleable)"), shown
    assert hook_runs_ours([]) == ("(null)", False)


def test_plugstack_path_is_slurms_default_where_unset():
    conf = Path("/etc/slurm/slurm.conf")
    assert plugstack_path("PlugStackConfig         = /x/plugstack.conf\n", conf) == \
        Path("/x/plugstack.conf")
    assert plugstack_path("PlugStackConfig         = (null)\n", conf) == \
        Path("/etc/slurm/plugstack.conf")
    assert plugstack_path("ClusterName = c\n", Path("/c/etc/slurm.conf")) == \
        Path("/c/etc/plugstack.conf")


def test_the_slurm_conf_in_use_is_found_as_slurms_clients_find_it():
    """A configless node has no /etc/slurm/slurm.conf: slurmd's copy in /run/slurm/conf. The
    SLURM_CONF scontrol prints is the controller's: the last resort."""
    printed = "/opt/slurm/etc/slurm.conf"
    on = lambda *present: (lambda p: str(p) in present)   # noqa: E731
    assert local_slurm_conf(Path("/x/slurm.conf"), printed, on()) == Path("/x/slurm.conf")
    assert local_slurm_conf(None, printed, on("/etc/slurm/slurm.conf", str(
        CONFIGLESS_SLURM_CONF))) == Path("/etc/slurm/slurm.conf")
    assert local_slurm_conf(None, printed, on(str(CONFIGLESS_SLURM_CONF))) == \
        CONFIGLESS_SLURM_CONF
    assert local_slurm_conf(None, printed, on()) == Path("/opt/slurm/etc/slurm.conf")
    assert local_slurm_conf(None, None, on()) == Path("/etc/slurm/slurm.conf")
    assert plugstack_path("", CONFIGLESS_SLURM_CONF) == Path("/run/slurm/conf/plugstack.conf")


def test_the_kill_switch_is_said():
    f = healthy()
    assert next(c for c in diagnose(f) if c.name == "kill switch").status is Status.OK
    f.switched_off = "malleability is switched off by 'malleable disable': maintenance"
    check = next(c for c in diagnose(f) if c.name == "kill switch")
    assert check.status is Status.WARN and "maintenance" in check.detail


def on_slurm(release: str, cgroup_conf_line: str | None, v2: bool | None) -> Facts:
    f = healthy()
    config = f.slurm_config.replace("SLURM_VERSION           = 22.05.8",
                                    f"SLURM_VERSION           = {release}")
    assert config != f.slurm_config
    if cgroup_conf_line is not None:
        config += f"\n{cgroup_conf_line}\n"
    f.slurm_config, f.cgroup_v2 = config, v2
    return f


def test_slurm_26_05_on_cgroup_v2_says_how_job_folders_are_named():
    """26.05's cgroup/v2 names job folders by SLUID unless CgroupJobIdPaths=yes; both are
    followed, and an idle node (no folder to see yet) says which from its configuration."""
    unset = diagnose(on_slurm("26.05.5", None, v2=True))
    check = next(c for c in unset if c.name == "job folder names")
    assert check.status is Status.OK and "by SLUID" in check.detail, check
    no = diagnose(on_slurm("26.05.5", "CgroupJobIdPaths        = no", v2=True))
    assert "by SLUID" in next(c for c in no if c.name == "job folder names").detail
    yes = diagnose(on_slurm("26.05.5", "CgroupJobIdPaths        = yes", v2=True))
    assert "by job id" in next(c for c in yes if c.name == "job folder names").detail
    # Unknown version of the layout (it was not found): said all the same.
    assert "job folder names" in statuses(on_slurm("26.05.5", None, v2=None))
    # Not that release, or cgroup v1: no such check.
    for release, v2 in (("24.11.5", True), ("26.05.5", False)):
        assert "job folder names" not in statuses(on_slurm(release, None, v2=v2))


def test_slurm_26_05s_own_configuration_says_its_job_folder_names():
    """scontrol show config of Debian sid's 26.05.5 with CgroupJobIdPaths=yes (captured in
    vm-slurm, SUITE=sid): by job id; the same text with the line gone: by SLUID."""
    real = (FIX / "slurm-26.05-cgroup-v2" / "scontrol_show_config.txt").read_text()
    f = healthy()
    f.slurm_config, f.cgroup_v2 = real, True

    def detail() -> str:
        return next(c for c in diagnose(f) if c.name == "job folder names").detail
    assert "by job id" in detail()
    f.slurm_config = "\n".join(x for x in real.splitlines() if "CgroupJobIdPaths" not in x)
    assert "by SLUID" in detail()
