"""What the rest of the project knows about Slurm jobs and nodes: typed, immutable records."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping

from slurm_plugin.topology import SlurmLayout


class JobState(enum.Enum):
    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    RESIZING = "RESIZING"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def parse(cls, text: str) -> "JobState":
        try:
            return cls(text.strip().upper())
        except ValueError:
            return cls.UNKNOWN

    @property
    def holds_cores(self) -> bool:
        """States in which the job's cores on its nodes are taken."""
        return self in (JobState.RUNNING, JobState.CONFIGURING, JobState.COMPLETING,
                        JobState.SUSPENDED)


@dataclass(frozen=True)
class Job:
    job_id: int
    name: str
    user: str
    uid: int
    state: JobState
    partition: str
    nodes: tuple[str, ...]
    num_cpus: int
    comment: str = ""
    admin_comment: str = ""
    # Per node, the (socket, core) pairs Slurm allocated, as squeue --json reports them.
    cores: Mapping[str, frozenset[tuple[int, int]]] = field(default_factory=dict)
    # Per node, the CPU ids of those cores (filled by the client, which knows node layouts).
    # Slurm's view never changes while the job runs; the current cores live in the cgroups.
    cpu_ids: Mapping[str, frozenset[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Node:
    name: str
    state: str
    state_flags: tuple[str, ...]
    cpus: int
    alloc_cpus: int
    partitions: tuple[str, ...]
    sockets: int = 1
    cores_per_socket: int = 1
    threads_per_core: int = 1
    hostname: str = ""
    port: int = 0
    address: str = ""          # NodeAddr: where the node's daemons are reached

    @property
    def layout(self) -> SlurmLayout:
        """How Slurm counts the node's CPUs (its abstract ids)."""
        return SlurmLayout(self.sockets, self.cores_per_socket, self.threads_per_core)

    @property
    def is_idle(self) -> bool:
        return self.state == "idle" and not self.state_flags


@dataclass(frozen=True)
class ControllerConfig:
    """What the watcher reads of slurmctld's configuration (``scontrol show config``)."""

    accounting_storage: str | None = None      # AccountingStorageType
    slurm_user_uid: int | None = None          # SlurmUser's uid: slurmctld's hooks run as it
    controllers: tuple[str, ...] = ()          # SlurmctldHost names, primary first
    state_save: str | None = None              # StateSaveLocation
    timeout_s: float = 120.0                   # SlurmctldTimeout
