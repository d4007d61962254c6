"""Where the agent and the ranks find each other's files (see the package docstring)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_RUN_DIR = Path("/run/malleable")
_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# [0-9], not \d: \d takes any Unicode digit ("step_٣").
_STEP_RE = re.compile(r"^step_([0-9]{1,10}|batch|interactive|extern)$")
_STATUS_RE = re.compile(
    r"^rank_([0-9]{1,9})(?:\.(step_(?:[0-9]{1,10}|batch|interactive|extern)))?\.json$")
# Slurm's step ids that have names (slurm.h) -> the step's cgroup folder.
_NAMED_STEPS = {0xfffffffb: "step_batch", 0xfffffffa: "step_interactive",
                0xfffffffc: "step_extern"}


def check_step_name(name: object) -> str:
    """A step's cgroup folder name as slurmstepd makes it (never a path)."""
    if not isinstance(name, str) or not _STEP_RE.fullmatch(name):
        raise ValueError(f"invalid step name {name!r:.32}")
    return name


def step_folder(step_id: str | None) -> str:
    """The cgroup folder of the step a process runs in, from its SLURM_STEP_ID (absent in a
    batch script before Slurm 26.05: the batch step). 26.05 prints the named steps' ids as
    signed numbers (the batch step's SLURM_STEP_ID is -5: 0xfffffffb)."""
    if step_id is None or step_id == "":
        return "step_batch"
    if step_id.startswith("-") and step_id[1:].isascii() and step_id[1:].isdigit() and \
            len(step_id) <= 3 and (2**32 - int(step_id[1:])) in _NAMED_STEPS:
        return _NAMED_STEPS[2**32 - int(step_id[1:])]
    if not (step_id.isascii() and step_id.isdigit()) or int(step_id) >= 2**32:
        raise ValueError(f"invalid step id {step_id!r:.32}")
    return _NAMED_STEPS.get(int(step_id), f"step_{int(step_id)}")


def check_job_id(job_id: object) -> int:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 0 < job_id < 2**32:
        raise ValueError(f"invalid job id {job_id!r:.32}")
    return job_id


def check_node_name(node: object) -> str:
    """A Slurm node name usable in a file name: no '/', no '..', not empty."""
    if not isinstance(node, str) or not _NODE_RE.fullmatch(node) or ".." in node:
        raise ValueError(f"invalid node name {node!r:.32}")
    return node


@dataclass(frozen=True)
class RunLayout:
    base: Path = DEFAULT_RUN_DIR

    @property
    def jobs_dir(self) -> Path:
        """Root-owned (0711: reachable by name, not listed): one folder per job, made by the
        Prolog for the job's user."""
        return self.base / "jobs"

    @property
    def targets_dir(self) -> Path:
        """Root-owned (0711): only root writes targets; each job's user reads his by name."""
        return self.base / "targets"

    def job_dir(self, job_id: int) -> Path:
        return self.jobs_dir / f"job_{check_job_id(job_id)}"

    @staticmethod
    def status_name(rank: int | str, step: str | None = None) -> str:
        """``rank_<r>.<step>.json``: ranks of several steps of one job (concurrent sruns) each
        have a rank 0. "{rank}" and "{step}" stay placeholders that each rank fills."""
        if rank != "{rank}" and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ValueError(f"invalid rank {rank!r:.32}")
        if step is not None and step != "{step}":
            check_step_name(step)
        return f"rank_{rank}.json" if step is None else f"rank_{rank}.{step}.json"

    def status_file(self, job_id: int, rank: int | str, step: str | None = None) -> Path:
        return self.job_dir(job_id) / self.status_name(rank, step)

    def rank_env(self, job_id: int) -> dict[str, str]:
        """What a rank of ``job_id`` needs to meet the node's agent (malleable-srun sets it;
        malleable_tf.init() assumes it inside a job whose folder the Prolog made): its record,
        its node's target, the cgroup as its allowance, a pool able to grow to the node."""
        return {"MALLEABLE_TF_STATUS": str(self.status_file(job_id, "{rank}", "{step}")),
                "MALLEABLE_TF_TARGET": str(self.target_file(job_id, "{node}")),
                "MALLEABLE_TF_ALLOWANCE": "cgroup", "MALLEABLE_TF_MAX_THREADS": "node"}

    @staticmethod
    def target_name(job_id: int, node: str) -> str:
        if node != "{node}":
            check_node_name(node)
        return f"job_{check_job_id(job_id)}.{node}.json"

    def target_file(self, job_id: int, node: str) -> Path:
        return self.targets_dir / self.target_name(job_id, node)

    @staticmethod
    def parse_status_name(name: str) -> int | None:
        """The rank of a status file name, or None for any other name."""
        m = _STATUS_RE.fullmatch(name)
        return int(m[1]) if m else None


# The jobs and targets folders: each user reaches his own entries by name; which jobs run on a
# node is listed to root only (Slurm's PrivateData).
ENTRY_DIR_MODE = 0o711
