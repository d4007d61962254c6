"""Where this host's Slurm keeps its configuration, found as Slurm's own clients find it
(src/common/read_config.c): a file given or SLURM_CONF, else the default slurm.conf where there
is one (a local file wins even on a configless site), else a configless slurmd's copy in
/run/slurm/conf (a link to its SlurmdSpoolDir/conf-cache)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from slurm_plugin.slurm.parsers import parse_config_value

DEFAULT_SLURM_CONF = Path("/etc/slurm/slurm.conf")
CONFIGLESS_SLURM_CONF = Path("/run/slurm/conf/slurm.conf")


def local_slurm_conf(given: Path | None, config_text: str = "",
                     exists: Callable[[Path], bool] = Path.is_file) -> Path:
    """The slurm.conf this host's Slurm reads: the one given (agent.json's, SLURM_CONF), else
    /etc/slurm's where there is one, else a configless slurmd's copy, else the path scontrol
    printed in ``config_text`` (SLURM_CONF: the controller's, right where a build has another
    sysconfdir on every host), else /etc/slurm's."""
    if given:
        return Path(given)
    for path in (DEFAULT_SLURM_CONF, CONFIGLESS_SLURM_CONF):
        if exists(path):
            return path
    printed = parse_config_value(config_text, "SLURM_CONF")
    return Path(printed) if printed and printed.startswith("/") else DEFAULT_SLURM_CONF
