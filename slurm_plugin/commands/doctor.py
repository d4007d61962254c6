"""``malleable doctor``: what a node has of the co-scheduler, checked after an install or when
something looks wrong. Run as root on the node.

``gather`` reads the node (Slurm's running configuration, the cgroup layout, the agent's pid
file and socket, the feed); ``diagnose(facts)`` is pure and says, check by check, what is fine,
what is missing and what to do. Exit 1 when any check fails.
"""
from __future__ import annotations

import argparse
import enum
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from malleable_protocol.runner import CommandError, CommandRunner, run_command

from slurm_plugin.slurm.parsers import (AllocationUnit, allocation_unit, parse_config_value,
                                        parse_config_values)
from slurm_plugin.cgroups import CgroupVersion
from slurm_plugin.commands.common import DEFAULT_AGENT_CONFIG, CliError
from slurm_plugin.hooks.slurm_conf import HOOK_KEYS, hook_runs_ours, release_of
from slurm_plugin.node.config import AgentConfig, load_agent_config
from slurm_plugin.settings import RootSettings, local_slurm_conf, root_settings

SPANK_SO = "malleable_spank.so"


class Status(enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str


@dataclass
class Facts:
    """What ``gather`` found on the node (each None: could not be read, with ``errors``)."""

    node: str
    slurm_config: str | None = None               # scontrol show config
    # Prolog, Epilog, PrologSlurmctld, EpilogSlurmctld -> (the script, whether it runs ours:
    # it names malleable itself, or a site's script that chains ours does)
    hooks: dict[str, tuple[str, bool]] = field(default_factory=dict)
    layout: str | None = None                     # the cgroup layout described
    cgroup_v2: bool | None = None                 # whether that layout is cgroup v2's
    numbering: str | None = None                  # the node's CPU numbering described
    switched_off: str | None = None               # why, when the site's kill switch is thrown
    cpu_layout: list[int] | None = None           # its sockets, cores per socket, threads
    plugstack_lines: list[str] | None = None      # PlugStackConfig's lines (files included)
    spank_so_exists: bool = False
    agent_pid: int | None = None
    step_socket: bool = False
    feed_mode: str | None = None                  # local / shared, and the file system
    feed_file: dict | None = None                 # the node's feed, parsed
    feed_age_s: float | None = None
    wake_port: int | None = None
    errors: dict[str, str] = field(default_factory=dict)


def diagnose(f: Facts) -> list[Check]:
    """Pure: the checks, in the order an installer would fix them."""
    out: list[Check] = []
    if f.slurm_config is None:
        out.append(Check("slurmctld", Status.FAIL, "scontrol show config failed: "
                         f"{f.errors.get('slurm', '?')} (is slurmctld up, SLURM_CONF right?)"))
    else:
        out.append(Check("slurmctld", Status.OK, "answers scontrol show config"))
        for key, what in (("Prolog", "takes lent cores back"),
                          ("Epilog", "frees and accounts the job's cores"),
                          ("PrologSlurmctld", "tells the watcher a job started"),
                          ("EpilogSlurmctld", "tells the watcher a job ended")):
            script, ours = f.hooks.get(key, ("(null)", False))
            out.append(Check(key, Status.OK if ours else Status.FAIL,
                             script if ours else f"{script}: does not run the malleable hook "
                             f"({what}); see docs/install.md to set it or chain it"))
        plugins = parse_config_value(f.slurm_config, "JobSubmitPlugins") or "(null)"
        out.append(Check("JobSubmitPlugins", Status.OK if "lua" in plugins else Status.FAIL,
                         plugins if "lua" in plugins else f"{plugins}: job_submit/lua is not "
                         "loaded, so --malleable and malleable: requests are not checked"))
    if f.plugstack_lines is None:
        out.append(Check("SPANK plugin", Status.FAIL, f"PlugStackConfig not readable: "
                         f"{f.errors.get('plugstack', '?')}"))
    else:
        ours = [line for line in f.plugstack_lines if SPANK_SO in line
                and not line.lstrip().startswith("#")]
        if not ours:
            out.append(Check("SPANK plugin", Status.FAIL, f"no {SPANK_SO} line in "
                             "PlugStackConfig: --malleable is unknown to sbatch, and steps in "
                             "grown jobs are not fenced"))
        elif not f.spank_so_exists:
            out.append(Check("SPANK plugin", Status.FAIL, f"{ours[0].split()[1]} is missing"))
        else:
            out.append(Check("SPANK plugin", Status.OK, ours[0].split()[1]))
    out.append(Check("cgroup layout", Status.OK if f.layout else Status.FAIL,
                     f.layout or f"not found: {f.errors.get('layout', '?')}"))
    folders = _job_folder_names_check(f)
    if folders is not None:
        out.append(folders)
    out.append(_numbering_check(f))
    out.append(Check("kill switch", Status.WARN, f"{f.switched_off}: every job keeps its "
                     "allocation ('malleable enable' lifts it)") if f.switched_off else
               Check("kill switch", Status.OK, "malleability is on"))
    out.append(Check("agent", Status.OK if f.agent_pid else Status.FAIL,
                     f"pid {f.agent_pid}" if f.agent_pid else "not running (no live agent in "
                     "its pid file): start malleable-agent@<node>"))
    out.append(Check("step socket", Status.OK if f.step_socket else Status.WARN,
                     "present" if f.step_socket else "missing: grown jobs' steps fall back to "
                     "the Python hook (slower)"))
    if f.feed_file is None:
        out.append(Check("feed", Status.FAIL, f"no feed for this node: "
                         f"{f.errors.get('feed', '?')} (is the watcher running, and the feed "
                         "folder the one it writes?)"))
    else:
        jobs = len(f.feed_file.get("jobs", []))
        out.append(Check("feed", Status.OK, f"{jobs} job(s), written "
                         f"{f.feed_age_s:.0f} s ago (the watcher writes on change)"))
    mode = f.feed_mode or "?"
    if mode.startswith("shared") and f.wake_port is None:
        out.append(Check("feed mode", Status.FAIL, f"{mode}, but no wake port registered: the "
                         "agent learns of changes only every feed_refresh_s"))
    else:
        out.append(Check("feed mode", Status.OK if f.feed_mode else Status.WARN,
                         mode + (f", wakes on UDP port {f.wake_port}" if f.wake_port else "")))
    return out


def _job_folder_names_check(f: Facts) -> Check | None:
    """Slurm 26.05's cgroup/v2 names a job's folder by its SLUID unless cgroup.conf says
    CgroupJobIdPaths=yes (26.05.2 added it). Both are followed: a SLUID folder's job is what a
    slurmstepd in it says (cgroups.JobFolderNames). Said from the configuration, so an idle
    node says it before its first job. None: not that Slurm, or not v2."""
    release = release_of(f.slurm_config or "")
    if release is None or release < (26, 5) or f.cgroup_v2 is False:
        return None
    value = parse_config_value(f.slurm_config or "", "CgroupJobIdPaths") or "(not set)"
    if value.lower() in ("yes", "true", "1", "up"):
        return Check("job folder names", Status.OK, "CgroupJobIdPaths=yes: by job id")
    return Check("job folder names", Status.OK,
                 f"CgroupJobIdPaths={value}: by SLUID (Slurm {release[0]}.{release[1]:02d} on "
                 "cgroup v2); each folder's job is what the slurmstepd in it says, and its cores "
                 "are lent to no one while none does")


def _numbering_check(f: Facts) -> Check:
    """Whether Slurm's CPU ids can be turned into this node's (slurm_plugin/topology.py)."""
    if f.numbering is None:
        return Check("CPU numbering", Status.FAIL, f"cannot be established: "
                     f"{f.errors.get('numbering', '?')}; jobs keep Slurm's allocation")
    slurm = (f.feed_file or {}).get("layout")
    if slurm is not None and slurm != f.cpu_layout:
        return Check("CPU numbering", Status.FAIL,
                     f"Slurm describes the node as {slurm} (sockets, cores, threads), its CPUs "
                     f"are {f.cpu_layout}: make slurm.conf what `slurmd -C` prints; jobs keep "
                     "Slurm's allocation")
    if f.cpu_layout is not None and f.cpu_layout[2] > 1:
        unit = allocation_unit(f.slurm_config)
        return Check("CPU numbering", Status.WARN if unit is AllocationUnit.UNKNOWN else Status.OK,
                     f"{f.numbering}; lends {unit.lending}")
    return Check("CPU numbering", Status.OK, f.numbering)


def _plugstack_lines(path: Path, depth: int = 0) -> list[str]:
    """The file's lines, with ``include`` globs expanded (as slurmstepd reads it)."""
    lines = []
    for line in path.read_text().splitlines()[:1000]:
        words = line.split()
        if words[:1] == ["include"] and len(words) > 1 and depth < 4:
            for inc in sorted(Path("/").glob(words[1].lstrip("/"))):
                lines += _plugstack_lines(inc, depth + 1)
        else:
            lines.append(line)
    return lines


def plugstack_path(config_text: str, slurm_conf: Path) -> Path:
    """The plugstack.conf slurmstepd reads: PlugStackConfig where set; else, Slurm's default,
    plugstack.conf beside the slurm.conf in use (24.11 shows an unset one as "(null)")."""
    set_to = parse_config_values(config_text, "PlugStackConfig")
    return Path(set_to[0]) if set_to else Path(slurm_conf).parent / "plugstack.conf"


def gather(config: AgentConfig, *, runner: CommandRunner = run_command,
           wall=time.time) -> Facts:
    from slurm_plugin.feed.notify import FeedMode, discover_feed_mode
    from slurm_plugin.feed.store import FeedStore
    from slurm_plugin.node.switch import switched_off
    from slurm_plugin.node.wiring import cpu_numbering, node_layout
    from slurm_plugin.node.procs import agent_pid
    f = Facts(node=config.node)
    env = {"SLURM_CONF": str(config.slurm_conf)} if config.slurm_conf else None
    try:
        f.slurm_config = runner(["scontrol", "show", "config"], timeout=20, env=env).stdout
    except CommandError as exc:
        f.errors["slurm"] = str(exc)
    for key in HOOK_KEYS:
        f.hooks[key] = hook_runs_ours(parse_config_values(f.slurm_config or "", key))
    try:
        text = f.slurm_config or ""
        plugstack = plugstack_path(text, local_slurm_conf(
            config.slurm_conf or root_settings().slurm_conf,
            parse_config_value(text, "SLURM_CONF")))
        f.plugstack_lines = _plugstack_lines(plugstack)
        so = next((line.split()[1] for line in f.plugstack_lines
                   if SPANK_SO in line and len(line.split()) > 1), None)
        f.spank_so_exists = so is not None and Path(so).is_file()
    except OSError as exc:
        f.errors["plugstack"] = str(exc)
    try:
        layout = node_layout(config)
        f.layout, f.cgroup_v2 = layout.describe(), layout.version is CgroupVersion.V2
    except Exception as exc:  # noqa: BLE001 - LayoutUnknown and what discovery may raise
        f.errors["layout"] = str(exc)
    f.switched_off = switched_off(config)
    numbering, refusal = cpu_numbering()
    if numbering is not None:
        f.numbering = numbering.describe()
        f.cpu_layout = [numbering.layout.sockets, numbering.layout.cores_per_socket,
                        numbering.layout.threads_per_core]
    else:
        f.errors["numbering"] = str(refusal)
    f.agent_pid = agent_pid(config.pid_file)
    f.step_socket = config.step_socket.is_socket()
    store = FeedStore(config.feed_dir)
    feed_path = store.nodes_dir / f"{config.node}.json"
    try:
        f.feed_file = json.loads(feed_path.read_bytes())
        f.feed_age_s = max(0.0, wall() - os.stat(feed_path).st_mtime)
    except (OSError, ValueError) as exc:
        f.errors["feed"] = str(exc)
    site_off = f.feed_file.get("switched_off") if isinstance(f.feed_file, dict) else None
    if f.switched_off is None and isinstance(site_off, str):
        f.switched_off = site_off
    try:
        mode, fstype = discover_feed_mode(config.feed_dir) \
            if config.feed_mode == "auto" else (FeedMode(config.feed_mode), "configured")
        f.feed_mode = f"{mode.value} ({fstype})"
        if config.feed_link_hosts:
            f.feed_mode += (f", the node's copy, filled by the feed link from "
                            f"{','.join(config.feed_link_hosts)} port {config.feed_link_port}")
    except OSError as exc:
        f.errors["feed mode"] = str(exc)
    f.wake_port = store.agent_wake_port(config.node)
    return f


def render(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    return "\n".join(f"{c.status.value:4}  {c.name:{width}}  {c.detail}" for c in checks)


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    dr = sub.add_parser("doctor", help="check this node's co-scheduler install (root): Slurm's "
                        "hooks, the SPANK plugin, the cgroup layout, the agent, the feed")
    dr.add_argument("--config", default=DEFAULT_AGENT_CONFIG,
                    help="agent.json (from install-slurm-hooks; default %(default)s, the "
                         "install guide's)")
    dr.add_argument("--node", help="the node (default: agent.json's, or SLURMD_NODENAME)")
    dr.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    overrides = {"node": args.node} if args.node else {}
    config = load_agent_config(args.config, **overrides)
    checks = diagnose(gather(config))
    print(render(checks))
    failed = [c.name for c in checks if c.status is Status.FAIL]
    if failed:
        raise CliError(f"node {config.node}: {len(failed)} check(s) failed: {', '.join(failed)}")
    return 0
