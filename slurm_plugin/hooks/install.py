"""``malleable install-slurm-hooks``: what a site installs for the co-scheduler (the node
Prolog and Epilog, the controller's event hook, job_submit.lua or its module form, agent.json,
the SPANK plugin and its plugstack.conf line), and the protocol's folders on a node."""
from __future__ import annotations

import json
import os
import string
import sys
from importlib import resources
from pathlib import Path

from malleable_protocol.errors import FixableError
from malleable_protocol.layout import ENTRY_DIR_MODE
from malleable_protocol.runner import CommandRunner, run_command
from malleable_protocol.safe_io import ensure_private_dir, not_roots_alone, others_may_change

from slurm_plugin.hooks import spank
from slurm_plugin.feed.store import FeedStore
from slurm_plugin.node.config import AgentConfig
from malleable_policy.request import GRAMMAR, lua_grammar_source, lua_literal


def _template(name: str) -> string.Template:
    return string.Template(resources.files("slurm_plugin.hooks").joinpath("templates", name).read_text())


# How each form of the job_submit template ends: a whole script defines Slurm's two entry points;
# the module returns its table to the site's job_submit.lua (docs/install.md).
_SCRIPT_ENDING = """\
function slurm_job_submit(job_desc, part_list, submit_uid)
   return malleable.job_submit(job_desc, part_list, submit_uid)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return malleable.job_modify(job_desc, job_rec, part_list, modify_uid)
end

return slurm.SUCCESS
"""
_MODULE_ENDING = "return malleable\n"
LUA_MODULE = "job_submit_malleable.lua"


class UnsafeInterpreter(FixableError):
    """The hooks would run, as root, code that a user other than root can change."""


# What the hooks import, run as ``python -I -m slurm_plugin.hooks``: where Python finds them.
_PROBE = ("import json, sys, slurm_plugin, malleable_protocol, malleable_policy\n"
          "print(json.dumps({'path': [p for p in sys.path if p],\n"
          "  'packages': [m.__path__[0] for m in (slurm_plugin, malleable_protocol, "
          "malleable_policy)]}))")
MAX_PACKAGE_FILES = 4096


def interpreter_problems(python: str, *, runner: CommandRunner = run_command) -> list[str]:
    """Why ``python`` is not root's alone to change: the interpreter, each folder it imports
    from in isolated mode, and the files of the packages the hooks import (``not_roots_alone``
    for each). A venv or a checkout a user may write would make the Prolog run his code as
    root. Empty when safe."""
    problems = not_roots_alone(Path(python))
    if problems:
        return problems
    found = json.loads(runner([python, "-I", "-c", _PROBE], timeout=60).stdout)
    for entry in found["path"]:
        if os.path.exists(entry):
            problems += not_roots_alone(Path(entry))
    for package in found["packages"]:
        problems += not_roots_alone(Path(package))
        for n, (folder, dirs, files) in enumerate(os.walk(package)):
            if n > MAX_PACKAGE_FILES:
                break
            for name in dirs + files:
                why = others_may_change(os.lstat(os.path.join(folder, name)))
                if why is not None:
                    problems.append(f"{os.path.join(folder, name)}: {why}")
    return list(dict.fromkeys(problems))


def check_interpreter(python: str, *, runner: CommandRunner = run_command) -> None:
    """Refuse (``UnsafeInterpreter``) an interpreter the hooks must not run as root."""
    problems = interpreter_problems(python, runner=runner)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more"
                                           if len(problems) > 5 else "")
        raise UnsafeInterpreter(
            f"the hooks run {python} as root, and a user other than root could change what it "
            f"runs: {shown}. Install the package where only root writes (the Debian package, "
            "or a venv root made in a folder only root may write)")


# What install-slurm-hooks's own options set in agent.json (the install guide's settings); a
# second run (an upgrade, step configure again) renders them anew and keeps every other
# setting the site changed by hand (input_cpu_budget_ms, enabled, max_borrowed_cpus, ...).
COMMAND_LINE_SETTINGS = frozenset({
    "node", "policy", "run_dir", "state_dir", "feed_dir", "max_cpus", "slurm_conf",
    "feed_link_hosts", "feed_link_port", "feed_link_auth", "watcher_dir"})


class SiteSettingsUnreadable(FixableError):
    """agent.json is there but cannot be kept: nothing is written until the site fixes it."""


def with_site_settings(config: AgentConfig, existing: Path) -> AgentConfig:
    """``config`` with the settings an existing agent.json holds beyond the command line's;
    ``config`` alone where there is none. One that does not parse or holds a bad value is
    refused (never silently replaced: it is the site's)."""
    try:
        old = json.loads(existing.read_text())
    except FileNotFoundError:
        return config
    except (OSError, ValueError) as exc:
        raise SiteSettingsUnreadable(f"{existing} cannot be read as JSON ({exc}): fix it, or "
                                     "remove it for the defaults") from None
    try:
        if not isinstance(old, dict):
            raise ValueError("not a JSON object")
        new = json.loads(config.to_json())
        kept = {k: v for k, v in old.items() if k in new and k not in COMMAND_LINE_SETTINGS}
        return AgentConfig.from_json(json.dumps({**new, **kept}))
    except (ValueError, TypeError) as exc:
        raise SiteSettingsUnreadable(f"{existing}: {exc}: fix it, or remove it for the "
                                     "defaults") from None


def install(dest: Path, config: AgentConfig, *, python: str = sys.executable,
            spank_library: Path | None = None,
            runner: CommandRunner = run_command) -> dict[str, Path]:
    """Render job_submit.lua (a whole script) and job_submit_malleable.lua (the same checks as
    a module for a site's own script), the node Prolog and Epilog, the controller's event hook
    (PrologSlurmctld and EpilogSlurmctld), agent.json and plugstack.conf (one line: a
    plugstack.conf.d drop-in) into ``dest``. The SPANK plugin is ``spank_library`` where given
    (the Debian package's, built when the package was), else built into ``dest`` here. The
    hooks run ``python`` isolated (-I): it must have this package installed (a venv, a .pth
    file, the Debian package), never found from a cwd or PYTHONPATH, and be root's alone to
    change (``check_interpreter``; refused before anything is written)."""
    check_interpreter(python, runner=runner)
    settings = with_site_settings(config, dest / "agent.json")
    dest.mkdir(parents=True, exist_ok=True)
    names = ("job_submit.lua", LUA_MODULE, "prolog.sh", "epilog.sh", "ctld_event.sh",
             "agent.json", "plugstack.conf")
    paths = {name: dest / name for name in names}
    if spank_library is None:
        paths[spank.LIBRARY] = spank.build(dest)
    elif not spank_library.is_absolute() or not spank_library.is_file():
        raise spank.SpankBuildError(f"no SPANK plugin at {spank_library} (an absolute path to "
                                    f"{spank.LIBRARY}, as the package installs it)")
    else:
        paths[spank.LIBRARY] = spank_library
    paths["plugstack.conf"].write_text(spank.plugstack_line(
        paths[spank.LIBRARY], python=python, config=paths["agent.json"],
        state_dir=config.state_dir))
    events = FeedStore(config.watcher_feed_dir).events_file
    paths["agent.json"].write_text(settings.to_json())
    paths["job_submit.lua"].write_text(render_job_submit(events, max_cpus=config.max_cpus or None))
    paths[LUA_MODULE].write_text(render_job_submit(events, max_cpus=config.max_cpus or None,
                                                   module=True))
    paths["ctld_event.sh"].write_text(_template("ctld_event.sh.tmpl").substitute(
        events_file=events))
    for hook in ("prolog.sh", "epilog.sh"):
        paths[hook].write_text(render_hook(hook, python=python, config=paths["agent.json"],
                                           state_dir=config.state_dir))
    for hook in ("prolog.sh", "epilog.sh", "ctld_event.sh"):
        paths[hook].chmod(0o755)
    return paths


def render_job_submit(events_file: Path, *, max_cpus: int | None = None,
                      module: bool = False) -> str:
    """job_submit.lua (or, with ``module``, the module a site's script loads): request.py's
    grammar, its numbers capped at the site's ``max_cpus`` (cores per node), and the watcher's
    event file."""
    return _template("job_submit.lua.tmpl").substitute(
        grammar=lua_grammar_source(GRAMMAR.for_site(max_cpus)),
        events_file=lua_literal(str(events_file)),
        ending=_MODULE_ENDING if module else _SCRIPT_ENDING)


def render_hook(name: str, *, python: str, config: Path, state_dir: Path) -> str:
    """The node's Prolog or Epilog (``prolog.sh``, ``epilog.sh``); ``state_dir``: the agents'
    state folder, where the Prolog's shell looks for the node's quiet file."""
    return _template(f"{name}.tmpl").substitute(python=python, config=config,
                                                state_dir=state_dir)


def prepare_node_folders(config: AgentConfig) -> None:
    """The protocol's folders on a node, root's: the run folder readable by all; jobs/ and
    targets/ reachable by name but not listable (0711: which jobs run here is nobody else's
    business); the state folder root's alone (0700)."""
    ensure_private_dir(config.run_dir).chmod(0o755)
    for folder in (config.layout.jobs_dir, config.layout.targets_dir):
        ensure_private_dir(folder, ENTRY_DIR_MODE)
    ensure_private_dir(config.state_dir).chmod(0o700)
