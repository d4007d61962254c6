"""Every environment variable the root side reads (the node's hooks and agent, the watcher, the
``malleable`` command, the development cluster), parsed in one place into ``RootSettings``: typed,
each unset or empty one its default, a bad value one ``SettingsError`` naming the variable.
The user side has its own (``malleable_runtime.settings``); Slurm's job environment in the hooks
is parsed where it is used (``hooks.job_hooks``), since slurmd sets it per job.

- SLURMD_NODENAME: the node slurmd runs a hook on (the hooks' agent.json is a node's own);
  SLURM_NODENAME: the node a job's command runs on (``malleable layout`` inside a job).
- SLURM_CONF: Slurm's configuration, where a command or the layout discovery is not told.
- MALLEABLE_FEED_DIR, MALLEABLE_STATE_DIR: the cluster's feed and the agents' state, for the
  commands that read them (unset: each command's default, ``DEFAULT_FEED_DIR`` or what
  agent.json says; the state: beside the feed).
- MALLEABLE_CLUSTER_DIR: the development cluster's folder (default /tmp/malleable-cluster).
- CC: the compiler of the SPANK plugin (default gcc).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from malleable_protocol import check_node_name
from malleable_protocol.errors import FixableError

DEFAULT_FEED_DIR = Path("/run/malleable/feed")
DEFAULT_SLURM_CONF = Path("/etc/slurm/slurm.conf")
CONFIGLESS_SLURM_CONF = Path("/run/slurm/conf/slurm.conf")   # a configless slurmd's copy
DEFAULT_CLUSTER_DIR = Path("/tmp/malleable-cluster")


class SettingsError(FixableError, ValueError):
    """A variable of the environment holds what it cannot: its name, and what it takes."""


@dataclass(frozen=True)
class RootSettings:
    slurmd_node: str | None = None          # SLURMD_NODENAME
    job_node: str | None = None             # SLURM_NODENAME
    slurm_conf: Path | None = None          # SLURM_CONF
    feed_dir: Path | None = None            # MALLEABLE_FEED_DIR
    state_dir: Path | None = None           # MALLEABLE_STATE_DIR
    cluster_dir: Path = DEFAULT_CLUSTER_DIR  # MALLEABLE_CLUSTER_DIR
    cc: str = "gcc"                         # CC

    @property
    def node(self) -> str | None:
        """This node's name as Slurm gave it to the process: slurmd's, else the job's."""
        return self.slurmd_node or self.job_node

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> RootSettings:
        return cls(slurmd_node=_node(environ, "SLURMD_NODENAME"),
                   job_node=_node(environ, "SLURM_NODENAME"),
                   slurm_conf=_path(environ, "SLURM_CONF"),
                   feed_dir=_path(environ, "MALLEABLE_FEED_DIR"),
                   state_dir=_path(environ, "MALLEABLE_STATE_DIR"),
                   cluster_dir=cluster_dir(environ),
                   cc=_word(environ, "CC") or "gcc")


def root_settings(environ: Mapping[str, str] | None = None) -> RootSettings:
    """The settings of this process's environment (``os.environ`` unless given)."""
    return RootSettings.from_env(os.environ if environ is None else environ)


def cluster_dir(environ: Mapping[str, str]) -> Path:
    """MALLEABLE_CLUSTER_DIR alone: read when the development cluster's module is imported, where
    another variable's bad value must not stop the import."""
    return _path(environ, "MALLEABLE_CLUSTER_DIR") or DEFAULT_CLUSTER_DIR


def _node(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "")
    if not value:
        return None
    try:
        return check_node_name(value)
    except ValueError:
        raise SettingsError(f"{name} must be a Slurm node name, not {value!r:.64}") from None


def _path(environ: Mapping[str, str], name: str) -> Path | None:
    value = environ.get(name, "")
    if not value:
        return None
    if "\n" in value:
        raise SettingsError(f"{name} must be a path, not {value!r:.64}")
    return Path(value)


def _word(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    if not value:
        return None
    if any(c.isspace() for c in value):
        raise SettingsError(f"{name} must be one command (no spaces), not {value!r:.64}")
    return value


def local_slurm_conf(given: Path | None, printed: str | None = None,
                     exists: Callable[[Path], bool] = Path.is_file) -> Path:
    """The slurm.conf this host's Slurm reads, found as Slurm's clients find it
    (read_config.c): the one given (agent.json's, SLURM_CONF), else /etc/slurm's where there
    is one (a local file wins even on a configless site), else a configless slurmd's copy
    (/run/slurm/conf, a link to its SlurmdSpoolDir/conf-cache), else ``printed``, the path
    `scontrol show config` printed (SLURM_CONF: the controller's, right where a build has
    another sysconfdir on every host), else /etc/slurm's."""
    if given:
        return Path(given)
    for path in (DEFAULT_SLURM_CONF, CONFIGLESS_SLURM_CONF):
        if exists(path):
            return path
    return Path(printed) if printed and printed.startswith("/") else DEFAULT_SLURM_CONF

