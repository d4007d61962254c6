"""The runtime's settings: every environment variable the core reads, parsed once, into
``Settings``; a framework's adapter adds its own (``malleable_tf.settings``).

``Settings.from_env(os.environ)`` gives each unset (or empty) variable its default and refuses a
bad value with one ValueError that names the variable and what it accepts. ``init()`` takes its
settings from it (its keyword arguments win), and so does ``malleable_tf.run``. The variables
keep the MALLEABLE_TF_ prefix they had when TensorFlow was the only framework: job scripts and
the co-scheduler's rank defaults (``malleable_protocol.RunLayout.rank_env``) set them.

- MALLEABLE_TF_MAX_THREADS: the pools' size, a number (1..4096) or "node" (every core of the
  node: what malleable-srun sets, so that a pool can grow past the cores held at launch).
- MALLEABLE_TF_FOLLOW=0: do not follow the allowance. MALLEABLE_TF_COUNT_STEPS=0: do not count
  each optimizer step. MALLEABLE_TF_LOG=0: no log lines. (Flags take 1/0, true/false, yes/no,
  on/off.)
- MALLEABLE_TF_SIGNALS: control signals and what each does, "RTMIN+3=reload,USR2=intra-down"
  (default: RTMIN+3=reload, see ``control.DEFAULT_RELOAD_SIGNAL``).
- MALLEABLE_TF_STATUS, MALLEABLE_TF_TARGET: the status record's and the target's paths, which may
  hold {rank}, {local_rank}, {pid}, {job}, {node}, {step}. A status set empty: no record (and
  no joining the co-scheduler's defaults).
- MALLEABLE_TF_ALLOWANCE, MALLEABLE_TF_PIN: one of a few words each (the enums below).
- Where the process runs, from its launcher and Slurm: its rank (torchrun's RANK,
  OMPI_COMM_WORLD_RANK, SLURM_PROCID, HOROVOD_RANK), local rank and size (``allowance.local_rank_and_size``),
  SLURM_JOB_ID, SLURM_STEP_ID, SLURMD_NODENAME and MALLEABLE_RUN_DIR (the co-scheduler's folder).

Not here: MALLEABLE_TF_AUTO_INIT (malleable-srun's, read before any runtime code runs).
"""
from __future__ import annotations

import enum
import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, TypeVar

from malleable_protocol import step_folder
from malleable_protocol.layout import DEFAULT_RUN_DIR

from .allowance import TORCHRUN_MARK, local_rank_and_size
from .control import DEFAULT_SIGNALS, Action, parse_signal_spec


class AllowanceSource(enum.Enum):
    """What the allowance is read from (MALLEABLE_TF_ALLOWANCE)."""

    AUTO = "auto"      # the affinity mask, the cpuset cgroup and the CPU quota
    # The cgroup alone (malleable-srun's): Slurm binds each task's mask at launch, and that mask
    # does not widen when the co-scheduler grows the cpuset.
    CGROUP = "cgroup"


class Pinning(enum.Enum):
    """What the threads are pinned to (MALLEABLE_TF_PIN); the thread counts are the same."""

    SHARE = "share"            # the rank's share of the allowance (locality)
    ALLOWANCE = "allowance"    # the whole allowance: the node's ranks float over its cores


# What the status and target paths may hold, each filled by init() for this process.
PATH_PLACEHOLDERS = ("rank", "local_rank", "pid", "job", "node", "step")


@dataclass(frozen=True)
class Settings:
    """What the environment says; the defaults are what an empty environment says."""

    max_threads: int | None = None        # None: the CPUs this process may use
    follow: bool = True
    count_steps: bool = True
    log: bool = True
    signals: Mapping[int, Action] = field(
        default_factory=lambda: MappingProxyType(dict(DEFAULT_SIGNALS)))
    status: str | None = None             # a path template; "" (set empty): no record
    target: str | None = None             # a path template
    allowance: AllowanceSource = AllowanceSource.AUTO
    pin: Pinning = Pinning.SHARE
    # Where this process runs.
    rank: int = 0
    local_rank: int = 0
    local_size: int = 1
    job_id: int | None = None             # None: not in a Slurm job
    step: str = "step_batch"              # the step's cgroup folder (SLURM_STEP_ID)
    node: str = ""                        # SLURMD_NODENAME; "" outside Slurm
    run_dir: Path = DEFAULT_RUN_DIR       # where the co-scheduler's job folders and targets are

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Every variable read once; a bad value raises ValueError naming the variable."""
        return cls(**core_fields(environ))


def core_fields(environ: Mapping[str, str]) -> dict[str, Any]:
    """The core's settings as keyword arguments, for an adapter's Settings to add its own."""
    local_rank, local_size = local_rank_and_size(environ)
    return dict(
        max_threads=_max_threads(environ), follow=_flag(environ, "MALLEABLE_TF_FOLLOW"),
        count_steps=_flag(environ, "MALLEABLE_TF_COUNT_STEPS"),
        log=_flag(environ, "MALLEABLE_TF_LOG"),
        signals=MappingProxyType(env_signals(environ)),
        status=_path_template(environ, "MALLEABLE_TF_STATUS"),
        target=_path_template(environ, "MALLEABLE_TF_TARGET") or None,
        allowance=env_choice(environ, "MALLEABLE_TF_ALLOWANCE", AllowanceSource.AUTO),
        pin=env_choice(environ, "MALLEABLE_TF_PIN", Pinning.SHARE),
        rank=_rank(environ), local_rank=local_rank, local_size=local_size,
        job_id=_job_id(environ), step=_step(environ),
        node=environ.get("SLURMD_NODENAME", ""),
        run_dir=Path(environ.get("MALLEABLE_RUN_DIR") or DEFAULT_RUN_DIR))


def env_signals(environ: Mapping[str, str]) -> dict[int, Action]:
    """MALLEABLE_TF_SIGNALS alone (the package ignores these signals from import to init())."""
    spec = environ.get("MALLEABLE_TF_SIGNALS", "")
    if not spec:
        return dict(DEFAULT_SIGNALS)
    try:
        return parse_signal_spec(spec)
    except ValueError as exc:
        raise ValueError(f"MALLEABLE_TF_SIGNALS must be NAME=action pairs, e.g. "
                         f"'RTMIN+3=reload,USR2=intra-down': {exc}") from None


E = TypeVar("E", bound=enum.Enum)
_FLAGS = {"1": True, "true": True, "yes": True, "on": True,
          "0": False, "false": False, "no": False, "off": False}
_DIGITS = re.compile(r"[0-9]{1,10}")    # ASCII only ("²".isdigit() is True), and short


def _one_of(words: list[str]) -> str:
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]


def env_choice(environ: Mapping[str, str], name: str, default: E) -> E:
    value = environ.get(name, "")
    if not value:
        return default
    kind = type(default)
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name} must be {_one_of([m.value for m in kind])}, "
                         f"not {value!r:.64}") from None


def _flag(environ: Mapping[str, str], name: str, default: bool = True) -> bool:
    value = environ.get(name, "")
    if not value.strip():
        return default
    try:
        return _FLAGS[value.strip().lower()]
    except KeyError:
        raise ValueError(f"{name} must be 1 or 0 (or true/false, yes/no, on/off), "
                         f"not {value!r:.64}") from None


def _max_threads(environ: Mapping[str, str]) -> int | None:
    value = environ.get("MALLEABLE_TF_MAX_THREADS", "")
    if not value:
        return None
    if value == "node":
        return os.cpu_count() or 1
    if not _DIGITS.fullmatch(value) or not 1 <= int(value) <= 4096:
        raise ValueError(f"MALLEABLE_TF_MAX_THREADS must be a number in 1..4096 or 'node', "
                         f"not {value!r:.64}")
    return int(value)


def _path_template(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    if value is None:
        return None
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
    except ValueError:     # an unpaired brace
        fields = [""]
    if any(f not in PATH_PLACEHOLDERS for f in fields):
        raise ValueError(f"{name} must be a path that may hold "
                         f"{', '.join('{%s}' % p for p in PATH_PLACEHOLDERS)}, "
                         f"not {value!r:.200}")
    return value


def _rank(environ: Mapping[str, str]) -> int:
    """The global rank: torchrun's (under srun, SLURM_PROCID is its agent's), then Open MPI's
    mpirun, then Slurm's srun, then Horovod's gloo runner."""
    names = ("OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "HOROVOD_RANK")
    for name in (("RANK", *names) if TORCHRUN_MARK in environ else names):
        value = environ.get(name, "")
        if value:
            if not _DIGITS.fullmatch(value):
                raise ValueError(f"{name} must be a rank (a number >= 0), not {value!r:.32}")
            return int(value)
    return 0


def _job_id(environ: Mapping[str, str]) -> int | None:
    value = environ.get("SLURM_JOB_ID", "")
    if not value:
        return None
    if not _DIGITS.fullmatch(value) or not 0 < int(value) < 2**32:
        raise ValueError(f"SLURM_JOB_ID must be a job id (1..4294967295), not {value!r:.32}")
    return int(value)


def _step(environ: Mapping[str, str]) -> str:
    value = environ.get("SLURM_STEP_ID")
    try:
        return step_folder(value)
    except ValueError:
        raise ValueError(f"SLURM_STEP_ID must be a step id (a number below 2**32), "
                         f"not {value!r:.32}") from None
