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
from dataclasses import dataclass, field
from pathlib import Path

from malleable_protocol import check_job_id, check_node_name, format_cpu_list, parse_cpu_list
from malleable_protocol.layout import check_step_name
from malleable_protocol.records import ProtocolError, decode_json_bounded
from malleable_protocol.safe_io import ensure_private_dir, read_bounded, write_atomic

from slurm_plugin.node.core_usage import CoreUsage

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


class LedgerFile:
    def __init__(self, state_dir: Path, node: str):
        self.folder = Path(state_dir)
        self.name = f"ledger-{check_node_name(node)}.json"

    def load(self) -> Ledger:
        """The ledger; an unreadable one is started anew (the feed re-teaches allocations)."""
        try:
            return Ledger.decode(read_bounded(self.folder / self.name, MAX_LEDGER_BYTES))
        except FileNotFoundError:
            return Ledger()
        except (OSError, ValueError, KeyError, TypeError):
            return Ledger()

    def save(self, ledger: Ledger) -> None:
        ensure_private_dir(self.folder)
        write_atomic(self.folder, self.name, ledger.encode(), mode=0o600)
