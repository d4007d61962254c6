"""What the site's slurm.conf needs for malleable, planned against the configuration slurmctld
runs with (``scontrol show config``: its ``Include`` files read, its defaults applied, its keys
as Slurm spells them), never written into slurm.conf.

Each key we need is found in one of four states (``KeyState``):
- present: it already runs ours (a glob whose folder holds our link, a site script that calls
  ours, ``lua`` among the job_submit plugins);
- add: unset, or a hook key the site set on a release that takes several (24.05 and later:
  read_config.c's S_P_ARRAY, each line one more program): our line goes into the snippet the
  admin merges, or the Include file;
- extend: JobSubmitPlugins the site set (one comma-separated value in every release): the
  line shown keeps the site's plugins and adds lua, and replaces the site's line;
- chain: a hook key the site set, on a release that takes one (22.05 to 23.11: S_P_STRING; a
  second line replaces the first): the admin calls ours from the site's own (prolog.d, or a
  line in the site's script).

The Include file is named without a folder (``Include malleable.conf``): configless slurmctld
serves an Include'd file to the nodes only when its name has no "/" (parse_config.c).

Pure but for ``hook_runs_ours``, which reads the scripts a value names (as slurmd would run
them); ``plan`` takes it injected."""
from __future__ import annotations

import enum
import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from slurm_plugin.slurm.parsers import (SlurmParseError, parse_config_value,
                                        parse_config_values, parse_slurm_version)

HOOK_KEYS = ("Prolog", "Epilog", "PrologSlurmctld", "EpilogSlurmctld")
# From this release on, read_config.c takes several programs for each of HOOK_KEYS, one per
# line (S_P_ARRAY, commas not split; scontrol shows "Prolog[0] = ..."); before it, one.
HOOKS_MULTI_VALUED_SINCE = (24, 5)
INCLUDE_NAME = "malleable.conf"


def runs_ours(script_text: str) -> bool:
    """Whether a hook script runs the malleable hook (ours names malleable; a site's own that
    chains it names ours)."""
    return "malleable" in script_text


def hook_runs_ours(values: list[str]) -> tuple[str, bool]:
    """(what slurm.conf names, whether one of its programs runs the malleable hook); a glob is
    expanded as slurmd does."""
    shown = ",".join(values) or "(null)"
    for value in values:
        scripts = sorted(glob.glob(value)) if glob.has_magic(value) else [value]
        for script in scripts:
            try:
                with open(script, "rb") as fh:
                    if runs_ours(fh.read(1 << 16).decode(errors="replace")):
                        return (f"{shown} ({script})" if script != value else shown), True
            except OSError:
                continue
    return shown, False


class KeyState(enum.Enum):
    PRESENT = "present"
    ADD = "add"
    EXTEND = "extend"
    CHAIN = "chain"


@dataclass(frozen=True)
class KeyPlan:
    key: str
    state: KeyState
    current: tuple[str, ...]     # the site's values ((): unset)
    line: str | None             # the line the admin merges (add, extend); None otherwise
    advice: str                  # what it does, or how to chain it


@dataclass(frozen=True)
class Wanted:
    """Ours, as install-slurm-hooks and step configure laid them out."""
    slurm_etc: Path              # the folder of the controller's slurm.conf
    prolog: str                  # a glob: the site's scripts and ours (/etc/slurm/prolog.d/*)
    epilog: str
    ctld_event: str              # PrologSlurmctld and EpilogSlurmctld (ctld_event.sh)

    @classmethod
    def of(cls, slurm_etc: Path, malleable_etc: Path) -> Wanted:
        return cls(slurm_etc, f"{slurm_etc}/prolog.d/*", f"{slurm_etc}/epilog.d/*",
                   f"{malleable_etc}/ctld_event.sh")


@dataclass(frozen=True)
class SlurmConfPlan:
    release: tuple[int, int] | None
    configless: bool
    keys: tuple[KeyPlan, ...]
    include_file: Path           # where the lines to add are written (beside slurm.conf)

    @property
    def needs_hand(self) -> list[KeyPlan]:
        return [k for k in self.keys if k.state in (KeyState.EXTEND, KeyState.CHAIN)]

    @property
    def to_add(self) -> list[KeyPlan]:
        return [k for k in self.keys if k.state is KeyState.ADD]

    def include_text(self) -> str:
        """The Include file's text: the lines of the unset keys only."""
        return "".join(f"{k.line}\n" for k in self.to_add)


WHAT = {"Prolog": "takes the job's cores back from the jobs that borrowed them",
        "Epilog": "frees and accounts the job's cores",
        "PrologSlurmctld": "tells the watcher a job started",
        "EpilogSlurmctld": "tells the watcher a job ended",
        "JobSubmitPlugins": "checks --malleable and malleable: requests (job_submit.lua)"}


def release_of(config_text: str) -> tuple[int, int] | None:
    """(major, minor) from ``SLURM_VERSION = 24.11.5``; None when not printed."""
    try:
        return parse_slurm_version(parse_config_value(config_text, "SLURM_VERSION") or "")
    except SlurmParseError:
        return None


def is_configless(config_text: str) -> bool:
    """slurmctld serves its configuration to nodes and clients (enable_configless)."""
    value = parse_config_value(config_text, "SlurmctldParameters") or ""
    return "enable_configless" in {w.strip().lower() for w in value.split(",")}


def plan(config_text: str, wanted: Wanted,
         runs: Callable[[list[str]], tuple[str, bool]] = hook_runs_ours) -> SlurmConfPlan:
    """Each key's state against the effective configuration ``config_text``."""
    release = release_of(config_text)
    # Unknown release: one value, the cautious reading (extending would replace on 23.11).
    multi = release is not None and release >= HOOKS_MULTI_VALUED_SINCE
    ours = {"Prolog": wanted.prolog, "Epilog": wanted.epilog,
            "PrologSlurmctld": wanted.ctld_event, "EpilogSlurmctld": wanted.ctld_event}
    keys = []
    for key in HOOK_KEYS:
        current = tuple(parse_config_values(config_text, key))
        keys.append(_hook_plan(key, current, ours[key], multi, runs))
    keys.append(_job_submit_plan(parse_config_value(config_text, "JobSubmitPlugins")))
    return SlurmConfPlan(release, is_configless(config_text), tuple(keys),
                         wanted.slurm_etc / INCLUDE_NAME)


def _hook_plan(key: str, current: tuple[str, ...], ours: str, multi: bool,
               runs: Callable[[list[str]], tuple[str, bool]]) -> KeyPlan:
    if not current:
        return KeyPlan(key, KeyState.ADD, (), f"{key}={ours}", WHAT[key])
    shown, found = runs(list(current))
    if found:
        return KeyPlan(key, KeyState.PRESENT, current, None, f"{shown}: {WHAT[key]}")
    if multi:
        return KeyPlan(key, KeyState.ADD, current, f"{key}={ours}",
                       f"{WHAT[key]}; beside the site's {shown} (this Slurm runs each)")
    site = current[0]
    if key in ("Prolog", "Epilog"):
        folder = str(Path(ours).parent)
        how = (f"link the site's script into the folder ours is in ({folder}: ln -s {site} "
               f"{folder}/10-site) and set {key}={ours}" if not any(c in site for c in "*?[")
               else f"link ours into the folder the site's glob names ({site})")
    else:
        how = f"add a line calling {ours} to {site} (passing its environment on: \"{ours}\")"
    return KeyPlan(key, KeyState.CHAIN, current, None,
                   f"{shown} is the site's and this Slurm takes one {key}: {how} "
                   f"({WHAT[key]})")


def _job_submit_plan(value: str | None) -> KeyPlan:
    key = "JobSubmitPlugins"
    current = tuple(v.strip() for v in (value or "").split(",")
                    if v.strip() and v.strip() != "(null)")
    if not current:
        return KeyPlan(key, KeyState.ADD, (), f"{key}=lua", WHAT[key])
    if any(v in ("lua", "job_submit/lua") for v in current):
        return KeyPlan(key, KeyState.PRESENT, current, None,
                       f"{','.join(current)}: the site's job_submit.lua calls ours (step "
                       "job-submit checks it)")
    return KeyPlan(key, KeyState.EXTEND, current, f"{key}={','.join((*current, 'lua'))}",
                   f"the site's plugins, then lua ({WHAT[key]}): replace the {key} line "
                   "with this one")


def render(p: SlurmConfPlan, written: bool) -> str:
    """What the admin reads: each key's state, then what to merge, where."""
    release = "unknown" if p.release is None else f"{p.release[0]}.{p.release[1]:02d}"
    out = [f"Slurm {release}; "
           + ("configless: only the controller's slurm.conf changes, slurmctld serves it "
              "(and the Include'd file) to the nodes" if p.configless else
              "not configless: every host's slurm.conf gets the same change")]
    width = max(len(k.key) for k in p.keys)
    out += [f"{k.state.value:7}  {k.key:{width}}  {k.advice}" for k in p.keys]
    if p.to_add:
        if written:
            out.append(f"\n{p.include_file} written with the lines below: add this line to "
                       f"slurm.conf (the name alone, so that configless slurmctld serves it):"
                       f"\nInclude {p.include_file.name}\n")
        else:
            out.append("\nadd to slurm.conf (or run again with --write-include):")
        out += [k.line for k in p.to_add if k.line]
    for k in p.needs_hand:
        if k.line:
            out.append(f"\nreplace the site's {k.key} line with:\n{k.line}")
    if not p.to_add and not p.needs_hand:
        out.append("\nslurm.conf already runs every malleable hook: nothing to merge")
    return "\n".join(out)
