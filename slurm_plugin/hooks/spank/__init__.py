"""The SPANK plugin that lets steps start in a grown job (see malleable_spank.c), and its build.

It is compiled at install time (``malleable install-slurm-hooks``, ``LocalCluster.up``) against
the installed Slurm's <slurm/spank.h>, and loaded by slurmstepd through plugstack.conf.
"""
from __future__ import annotations

import os
import shutil
from importlib import resources
from pathlib import Path

from malleable_protocol.runner import CommandError, run_command
from malleable_protocol.errors import FixableError
from slurm_plugin.settings import root_settings

SOURCE = "malleable_spank.c"
LIBRARY = "malleable_spank.so"
HEADER = Path("/usr/include/slurm/spank.h")


class SpankBuildError(FixableError, RuntimeError):
    pass


def build(dest: Path, *, compiler: str | None = None, include: Path = HEADER.parent.parent
          ) -> Path:
    """Compile the plugin into ``dest`` (replaced atomically; world-readable: srun, sbatch and
    salloc load plugstack.conf's plugins too)."""
    cc = compiler or root_settings().cc
    if shutil.which(cc) is None:
        raise SpankBuildError(f"building the SPANK plugin needs a C compiler, and '{cc}' is not "
                              "on PATH (apt-get install gcc)")
    if not (include / "slurm" / "spank.h").exists():
        raise SpankBuildError(f"building the SPANK plugin needs Slurm's headers, and "
                              f"{include / 'slurm' / 'spank.h'} is missing "
                              "(apt-get install libslurm-dev)")
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / LIBRARY
    tmp = dest / f".{LIBRARY}.{os.getpid()}"
    with resources.as_file(resources.files(__package__).joinpath(SOURCE)) as src:
        try:
            run_command([cc, "-std=gnu11", "-O2", "-Wall", "-Werror", "-shared", "-fPIC",
                         f"-I{include}", str(src), "-o", str(tmp)], timeout=120)
        except CommandError as exc:
            tmp.unlink(missing_ok=True)
            raise SpankBuildError(f"building the SPANK plugin failed: {exc}") from exc
    tmp.chmod(0o755)
    os.replace(tmp, out)
    return out


def plugstack_line(library: Path, *, python: str, config: Path, state_dir: Path,
                   timeout_s: float = 20.0) -> str:
    """``state_dir``: the agents' state folder (root's), where the plugin finds each node's
    lock, gate and fence files and the agent's socket (``step_gate``, ``step_socket``)."""
    return (f"required {library} python={python} config={config} state={state_dir} "
            f"timeout={timeout_s:g}\n")
