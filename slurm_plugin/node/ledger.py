"""What the node remembers without slurmctld, in root's state folder (one file per node):

- each job's Slurm allocation on this node, recorded the first time its cgroup folder is seen
  (slurmstepd makes the job folder on exactly the allocation, before anyone resizes it), so a
  job is known from the moment it starts even when the cluster's feed has not caught up;
- the jobs whose Prolog has run and whose cores are not known yet ("starting"): while any is,
  nobody may hold cores outside their own allocation;
- the jobs whose Epilog has run ("ended"): their cores are free even while the cluster's feed,
  which lags, still lists them;
- the steps starting in a job ("fences", marked by the SPANK plugin's step-start hook): until
  the step's slurmstepd has joined its cpuset, the job holds exactly its allocation;
- each running job's core-seconds borrowed above its allocation and lent below it, with the
  width it holds now ("usage", ``accounting``): updated every cycle, closed by the Epilog.

Read and written only under the node's lock.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from malleable_protocol import check_job_id, check_node_name, format_cpu_list, parse_cpu_list
from malleable_protocol.layout import check_step_name
from malleable_protocol.records import ProtocolError, decode_json_bounded
from malleable_protocol.safe_io import UnsafePath, ensure_private_dir, read_bounded, write_atomic

from slurm_plugin.node.core_usage import CoreUsage

log = logging.getLogger(__name__)

MAX_LEDGER_BYTES = 4 << 20
STARTING_EXPIRY_S = 3600.0   # a start marker no Epilog removed (a lost job) expires
FENCE_EXPIRY_S = 60.0        # a step that never joined its cpuset has failed to start


@dataclass(frozen=True)
class Fence:
    """A step of a job is starting: its slurmstepd (``stepd_pid``, root's) is about to write
    the job's folder back to the allocation."""

    step: str           # the step's cgroup folder name: step_batch, step_0, ...
    stepd_pid: int
    since: float        # wall time marked


@dataclass(frozen=True)
class Allocation:
    uid: int
    cpus: frozenset[int]


@dataclass
class Ledger:
    allocations: dict[int, Allocation] = field(default_factory=dict)
    starting: dict[int, float] = field(default_factory=dict)     # job id -> wall time marked
    ended: dict[int, float] = field(default_factory=dict)
    fences: dict[tuple[int, str], Fence] = field(default_factory=dict)   # (job, step) -> fence
    usage: dict[int, CoreUsage] = field(default_factory=dict)   # running jobs' (accounting)

    def fenced_jobs(self) -> set[int]:
        return {job_id for job_id, _ in self.fences}

    def encode(self) -> bytes:
        return json.dumps({
            "allocations": {str(k): {"uid": a.uid, "cpus": format_cpu_list(a.cpus)}
                            for k, a in sorted(self.allocations.items())},
            "starting": {str(k): t for k, t in sorted(self.starting.items())},
            "ended": {str(k): t for k, t in sorted(self.ended.items())},
            "fences": {f"{j}/{f.step}": {"pid": f.stepd_pid, "since": f.since}
                       for (j, _), f in sorted(self.fences.items())},
            "usage": {str(k): u.to_json() for k, u in sorted(self.usage.items())}},
            sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Ledger":
        """Raises ProtocolError only (``load`` starts anew on it)."""
        d = decode_json_bounded(raw, max_bytes=MAX_LEDGER_BYTES, max_depth=3)
        led = cls()
        try:
            for k, v in (d.get("allocations") or {}).items():
                led.allocations[check_job_id(int(k))] = Allocation(int(v["uid"]),
                                                                   parse_cpu_list(v["cpus"]))
            for k, t in (d.get("starting") or {}).items():
                led.starting[check_job_id(int(k))] = float(t)
            for k, t in (d.get("ended") or {}).items():
                led.ended[check_job_id(int(k))] = float(t)
            for k, v in (d.get("fences") or {}).items():
                job, _, step = k.partition("/")
                led.fences[(check_job_id(int(job)), check_step_name(step))] = Fence(
                    check_step_name(step), int(v["pid"]), float(v["since"]))
            for k, v in (d.get("usage") or {}).items():
                led.usage[check_job_id(int(k))] = CoreUsage.from_json(v)
        # A list where a map belongs has no .items(); int(Infinity) and float(10**400) overflow.
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ProtocolError(f"bad ledger: {exc}") from None
        return led


class LedgerCorrupt(ValueError):
    """The ledger could not be decoded: the node refuses to act until an admin has looked."""


class LedgerFile:
    def __init__(self, state_dir: Path, node: str):
        self.folder = Path(state_dir)
        self.name = f"ledger-{check_node_name(node)}.json"

    @property
    def kept_aside(self) -> Path:
        """Where a ledger that could not be decoded is kept, for the admin to look at."""
        return self.folder / f"{self.name}.corrupt"

    def load(self) -> Ledger:
        """The ledger; none yet: an empty one. One that cannot be decoded is kept aside and
        logged, and this and every later load raise ``LedgerCorrupt`` until the admin removes
        the kept file: without its fences and allocations the node would guess which cores are
        whose, so it changes nothing. An OSError reading it (EIO) is raised as it is."""
        path = self.folder / self.name
        try:
            return Ledger.decode(read_bounded(path, MAX_LEDGER_BYTES))
        except FileNotFoundError:
            if self.kept_aside.exists():
                raise LedgerCorrupt(self._refusal()) from None
            return Ledger()
        except UnsafePath as exc:      # not a regular file, or over the bound: root wrote neither
            reason = str(exc)
        except (ValueError, KeyError, TypeError) as exc:    # ProtocolError is a ValueError
            reason = f"{type(exc).__name__}: {exc}"
        os.replace(path, self.kept_aside)
        log.error("ledger %s cannot be decoded (%.200s); kept aside as %s", path, reason,
                  self.kept_aside)
        raise LedgerCorrupt(self._refusal()) from None

    def _refusal(self) -> str:
        return (f"the node's ledger could not be decoded and is kept in {self.kept_aside}: no "
                "cpuset changes until an admin checks the jobs' cores (malleable status, "
                "malleable doctor) and removes that file")

    def save(self, ledger: Ledger) -> None:
        ensure_private_dir(self.folder)
        write_atomic(self.folder, self.name, ledger.encode(), mode=0o600)
