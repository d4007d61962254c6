"""Where the agent and the ranks find each other's files (see the package docstring)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_RUN_DIR = Path("/run/malleable")
_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_job_id(job_id: object) -> int:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 0 < job_id < 2**32:
        raise ValueError(f"invalid job id {job_id!r}")
    return job_id


def check_node_name(node: object) -> str:
    """A Slurm node name usable in a file name: no '/', no '..', not empty."""
    if not isinstance(node, str) or not _NODE_RE.fullmatch(node) or ".." in node:
        raise ValueError(f"invalid node name {node!r}")
    return node


@dataclass(frozen=True)
class RunLayout:
    base: Path = DEFAULT_RUN_DIR

    @property
    def jobs_dir(self) -> Path:
        """Root-owned (0755): one folder per job, made by the Prolog for the job's user."""
        return self.base / "jobs"

    @property
    def targets_dir(self) -> Path:
        """Root-owned (0755): only root writes targets."""
        return self.base / "targets"

    def job_dir(self, job_id: int) -> Path:
        return self.jobs_dir / f"job_{check_job_id(job_id)}"

    @staticmethod
    def status_name(rank: int | str) -> str:
        # "{rank}" stays a placeholder for the launcher, which fills it per rank.
        if rank != "{rank}" and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ValueError(f"invalid rank {rank!r}")
        return f"rank_{rank}.json"

    def status_file(self, job_id: int, rank: int | str) -> Path:
        return self.job_dir(job_id) / self.status_name(rank)

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
        if name.startswith("rank_") and name.endswith(".json"):
            digits = name[5:-5]
            if digits.isdigit() and len(digits) <= 9:
                return int(digits)
        return None
