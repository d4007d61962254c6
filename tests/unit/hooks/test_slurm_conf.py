"""What `malleable slurm-conf` plans for slurm.conf, from `scontrol show config` as each Slurm
release prints it (22.05 and 23.11: "Prolog = /x" or "(null)", one program; 24.05 on:
"Prolog[0] = /x", one line per program, none when unset). It never edits slurm.conf."""
from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_plugin.commands import slurm_conf as command
from slurm_plugin.commands.common import CliError
from slurm_plugin.hooks.slurm_conf import KeyState, Wanted, is_configless, plan, release_of

WANTED = Wanted.of(Path("/etc/slurm"), Path("/etc/malleable"))


def show_config(version: str, **keys: str | list[str]) -> str:
    """scontrol show config's lines ("%-23s = %s"); a list is 24.05's array of programs."""
    lines = [f"{'SLURM_CONF':23} = /etc/slurm/slurm.conf", f"{'SLURM_VERSION':23} = {version}"]
    for key, value in keys.items():
        if isinstance(value, list):
            lines += [f"{f'{key}[{i}]':23} = {v}" for i, v in enumerate(value)]
        else:
            lines.append(f"{key:23} = {value}")
    return "\n".join(lines) + "\n"


def never_ours(values: list[str]) -> tuple[str, bool]:
    return ",".join(values) or "(null)", False


def states(p) -> dict[str, KeyState]:
    return {k.key: k.state for k in p.keys}


def test_a_site_without_hooks_gets_every_line_to_add():
    text = show_config("22.05.8", Prolog="(null)", Epilog="(null)", PrologSlurmctld="(null)",
                       EpilogSlurmctld="(null)", JobSubmitPlugins="(null)")
    p = plan(text, WANTED, never_ours)
    assert set(states(p).values()) == {KeyState.ADD} and not p.needs_hand
    assert p.include_text() == (
        "Prolog=/etc/slurm/prolog.d/*\nEpilog=/etc/slurm/epilog.d/*\n"
        "PrologSlurmctld=/etc/malleable/ctld_event.sh\n"
        "EpilogSlurmctld=/etc/malleable/ctld_event.sh\nJobSubmitPlugins=lua\n")
    assert p.include_file == Path("/etc/slurm/malleable.conf") and not p.configless


def test_on_23_11_a_prolog_the_site_set_is_chained_never_replaced():
    """23.11 reads one Prolog (S_P_STRING): a second line would replace the site's."""
    text = show_config("23.11.9", Prolog="/etc/slurm/site-prolog.sh",
                       Epilog="/opt/site/epilog.d/*", PrologSlurmctld="/opt/site/ctld.sh",
                       EpilogSlurmctld="(null)", JobSubmitPlugins="pbs")
    p = plan(text, WANTED, never_ours)
    assert states(p) == {"Prolog": KeyState.CHAIN, "Epilog": KeyState.CHAIN,
                         "PrologSlurmctld": KeyState.CHAIN, "EpilogSlurmctld": KeyState.ADD,
                         "JobSubmitPlugins": KeyState.EXTEND}
    advice = {k.key: k.advice for k in p.keys}
    assert "ln -s /etc/slurm/site-prolog.sh /etc/slurm/prolog.d/10-site" in advice["Prolog"]
    assert "link ours into the folder the site's glob names (/opt/site/epilog.d/*)" in \
        advice["Epilog"]
    assert "add a line calling /etc/malleable/ctld_event.sh to /opt/site/ctld.sh" in \
        advice["PrologSlurmctld"]
    assert {k.key: k.line for k in p.needs_hand}["JobSubmitPlugins"] == "JobSubmitPlugins=pbs,lua"
    assert p.include_text() == "EpilogSlurmctld=/etc/malleable/ctld_event.sh\n"


def test_from_24_05_ours_runs_beside_the_sites_own():
    text = show_config("24.11.5", Prolog=["/etc/slurm/site-prolog.sh", "/opt/b.sh"],
                       PrologSlurmctld=["/opt/site/ctld.sh"], JobSubmitPlugins="lua",
                       SlurmctldParameters="idle_on_node_suspend,enable_configless")
    p = plan(text, WANTED, never_ours)
    assert set(states(p).values()) - {KeyState.ADD} == {KeyState.PRESENT}   # lua is there
    prolog = next(k for k in p.keys if k.key == "Prolog")
    assert prolog.current == ("/etc/slurm/site-prolog.sh", "/opt/b.sh")
    assert prolog.line == "Prolog=/etc/slurm/prolog.d/*" and "beside the site's" in prolog.advice
    assert p.configless and p.release == (24, 11)


def test_an_unknown_release_is_read_as_one_value_each():
    text = "Prolog = /etc/slurm/site-prolog.sh\n"
    assert release_of(text) is None
    assert states(plan(text, WANTED, never_ours))["Prolog"] is KeyState.CHAIN
    assert release_of(show_config("26.05.3")) == (26, 5)
    assert release_of(show_config("9" * 40 + ".1")) is None


def test_configless_is_read_from_slurmctld_parameters():
    assert is_configless("SlurmctldParameters     = enable_configless\n")
    assert is_configless("SlurmctldParameters = cloud_dns, Enable_Configless\n")
    assert not is_configless("SlurmctldParameters     = (null)\n")
    assert not is_configless("SlurmctldParameters = enable_configless_x\n")


def test_a_hook_that_already_runs_ours_is_present(tmp_path):
    """A glob whose folder holds our link (step configure made it) is found by reading the
    scripts, as slurmd would run them."""
    folder = tmp_path / "prolog.d"
    folder.mkdir()
    (folder / "50-malleable").write_text("#!/bin/sh\nexec python3 -m slurm_plugin.hooks "
                                         "prolog --config /etc/malleable/agent.json\n")
    text = show_config("22.05.8", Prolog=f"{folder}/*")
    assert states(plan(text, WANTED))["Prolog"] is KeyState.PRESENT


def run_command(tmp_path: Path, text: str, write: bool):
    args = argparse.Namespace(slurm_etc=tmp_path, malleable_etc=Path("/etc/malleable"),
                              write_include=write)
    return command.run(args, runner=lambda argv, **_: SimpleNamespace(stdout=text))


def test_the_command_writes_only_the_include_file(tmp_path, capsys):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\nProlog=/etc/slurm/site.sh\n")
    text = show_config("24.11.5", Prolog=["/etc/slurm/site.sh"], JobSubmitPlugins="(null)")
    assert run_command(tmp_path, text, write=False) == 0
    assert not (tmp_path / "malleable.conf").exists()
    assert "add to slurm.conf" in capsys.readouterr().out
    assert run_command(tmp_path, text, write=True) == 0
    written = (tmp_path / "malleable.conf").read_text()
    assert "Prolog=" + str(Path("/etc/slurm/prolog.d/*")) not in written   # SLURM_ETC's own
    assert f"Prolog={tmp_path}/prolog.d/*\n" in written and "JobSubmitPlugins=lua\n" in written
    assert (tmp_path / "malleable.conf").stat().st_mode & 0o777 == 0o644
    assert "Include malleable.conf" in capsys.readouterr().out
    assert conf.read_text() == "ClusterName=c\nProlog=/etc/slurm/site.sh\n"


def test_the_command_fails_when_a_key_needs_the_admins_hand(tmp_path, capsys):
    text = show_config("22.05.8", Prolog="/etc/slurm/site.sh")
    with pytest.raises(CliError, match="Prolog"):
        run_command(tmp_path, text, write=True)
    out = capsys.readouterr().out
    assert "chain" in out and out.startswith("Slurm 22.05; ")    # as Slurm spells its release
