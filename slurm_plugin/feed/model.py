"""What the watcher publishes per node, and what node agents publish back: typed, bounded."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Mapping

from malleable_protocol import ProtocolError, check_job_id, check_node_name, format_cpu_list, \
    parse_cpu_list
from malleable_protocol.records import decode_json_bounded

from malleable_policy.request import MalleableSpec, RequestError, parse_submit
from slurm_plugin.topology import SlurmLayout

MAX_FEED_BYTES = 1 << 20
MAX_SWITCH_REASON = 300
MAX_JOBS_PER_NODE = 4096
# A Slurm partition name as the feed carries it (the site's weight table is keyed by it).
_PARTITION = re.compile(r"[A-Za-z0-9_.+-]{1,64}")


def partition_name(text: str) -> str:
    """``text`` if it is a partition name the feed carries, else "" (no partition: the site's
    default weight limit applies, never a partition's)."""
    return text if _PARTITION.fullmatch(text) else ""


_JOB_KEY = re.compile(r"[0-9]{1,10}")       # [0-9]: "²".isdigit() is True, int("²") fails


def _node(d: Mapping) -> str:
    """A record's node name, refused with ProtocolError (check_node_name's is a ValueError)."""
    try:
        return check_node_name(d.get("node"))
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None


@dataclass(frozen=True)
class FeedJob:
    """A job that holds cores on the node, as slurmctld sees it."""

    job_id: int
    uid: int
    user: str
    allocation: frozenset[int]            # Slurm's cores on this node (never changes)
    nodes: tuple[str, ...] = ()           # every node of the job
    spec: MalleableSpec | None = None     # None: not malleable (bounds from AdminComment)
    requested: int | None = None          # cpus=K from Comment
    partition: str = ""                   # the partition it runs in ("": not known)

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "uid": self.uid, "user": self.user,
                "allocation": format_cpu_list(self.allocation), "nodes": list(self.nodes),
                "spec": None if self.spec is None else self.spec.normal_form(),
                "requested": self.requested, "partition": self.partition}

    @classmethod
    def from_dict(cls, d: Mapping) -> "FeedJob":
        try:
            spec = None if d.get("spec") is None else parse_submit(str(d["spec"]))
            req = d.get("requested")
            if req is not None and (isinstance(req, bool) or not isinstance(req, int) or req < 1):
                raise ProtocolError("bad requested")
            uid = d["uid"]
            if isinstance(uid, bool) or not isinstance(uid, int) or not 0 <= uid < 2**32:
                raise ProtocolError("bad uid")
            partition = d.get("partition", "")      # "": a feed from before it was carried
            if not isinstance(partition, str) or partition_name(partition) != partition:
                raise ProtocolError("bad partition")
            return cls(job_id=check_job_id(d["job_id"]), uid=uid, user=str(d.get("user", ""))[:64],
                       allocation=parse_cpu_list(str(d["allocation"])),
                       nodes=tuple(check_node_name(n) for n in d.get("nodes", [])[:65536]),
                       spec=spec, requested=req, partition=partition)
        except (KeyError, TypeError, RequestError, ValueError) as exc:
            raise ProtocolError(f"bad feed job: {exc}") from None


@dataclass(frozen=True)
class NodeFeed:
    node: str
    cpus: int                             # cores Slurm may hand out on the node
    jobs: tuple[FeedJob, ...]
    updated: float = 0.0                  # wall time of the poll it came from
    # Slurm's description of the node, which its abstract CPU ids (the jobs' allocations) are
    # counted in; None from a watcher older than it.
    layout: SlurmLayout | None = None
    # Why the site switched malleability off everywhere (``malleable disable --site``): every
    # agent holds every job to its allocation while it is set.
    switched_off: str | None = None

    def job(self, job_id: int) -> FeedJob | None:
        return next((j for j in self.jobs if j.job_id == job_id), None)

    def encode(self) -> bytes:
        d = {"node": self.node, "cpus": self.cpus, "updated": self.updated,
             "jobs": [j.to_dict() for j in self.jobs]}
        if self.layout is not None:
            d["layout"] = [self.layout.sockets, self.layout.cores_per_socket,
                           self.layout.threads_per_core]
        if self.switched_off is not None:
            d["switched_off"] = self.switched_off
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    def same_content(self, other: "NodeFeed | None") -> bool:
        return other is not None and \
            (self.node, self.cpus, self.jobs, self.layout, self.switched_off) == \
            (other.node, other.cpus, other.jobs, other.layout, other.switched_off)

    @classmethod
    def decode(cls, raw: bytes) -> "NodeFeed":
        d = decode_json_bounded(raw, max_bytes=MAX_FEED_BYTES, max_depth=4)
        jobs = d.get("jobs")
        cpus = d.get("cpus")
        if not isinstance(jobs, list) or len(jobs) > MAX_JOBS_PER_NODE or \
                isinstance(cpus, bool) or not isinstance(cpus, int) or not 0 < cpus <= 65536:
            raise ProtocolError("bad node feed")
        updated = d.get("updated", 0.0)
        if isinstance(updated, bool) or not isinstance(updated, (int, float)) or \
                not 0 <= updated <= 1e12:       # float() of a 400-digit int overflows
            raise ProtocolError("bad node feed time")
        layout = d.get("layout")
        if layout is not None and not (
                isinstance(layout, list) and len(layout) == 3 and
                all(isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 65536
                    for n in layout)):
            raise ProtocolError("bad node feed layout")
        off = d.get("switched_off")
        if off is not None and not (isinstance(off, str) and len(off) <= MAX_SWITCH_REASON):
            raise ProtocolError("bad node feed switch")
        return cls(node=_node(d), cpus=cpus,
                   jobs=tuple(FeedJob.from_dict(j) for j in jobs if isinstance(j, dict)),
                   updated=float(updated),
                   layout=SlurmLayout(*layout) if layout is not None else None,
                   switched_off=off)


@dataclass(frozen=True)
class Offers:
    """A node agent's offer per multi-node malleable job: the cores per rank it would give the
    job there if no other node held it back (the job's other nodes cap it to the smallest)."""

    node: str
    per_rank: Mapping[int, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        return json.dumps({"node": self.node,
                           "per_rank": {str(k): v for k, v in sorted(self.per_rank.items())}},
                          sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Offers":
        d = decode_json_bounded(raw, max_bytes=MAX_FEED_BYTES, max_depth=2)
        per = d.get("per_rank")
        if not isinstance(per, dict) or len(per) > MAX_JOBS_PER_NODE:
            raise ProtocolError("bad offers")
        out = {}
        for k, v in per.items():
            if not (_JOB_KEY.fullmatch(k) and 0 < int(k) < 2**32) or isinstance(v, bool) or \
                    not isinstance(v, int) or not 0 < v <= 65536:
                raise ProtocolError("bad offer")
            out[int(k)] = v
        return cls(node=_node(d), per_rank=out)


@dataclass(frozen=True)
class JobReport:
    job_id: int
    current: frozenset[int]
    threads: tuple[int, ...] = ()           # per rank on this node, by rank
    steps_per_s: tuple[float, ...] = ()     # per rank, at its current thread count


@dataclass(frozen=True)
class NodeReport:
    """What a node agent shows of its jobs (for ``malleable status`` anywhere the feed is)."""

    node: str
    jobs: tuple[JobReport, ...] = ()
    problems: tuple[str, ...] = ()          # what the agent cannot verify (NodeSnapshot)
    held: str | None = None                 # why every job keeps its allocation (a Hold)

    def encode(self) -> bytes:
        d: dict[str, object] = {"node": self.node, "jobs": [
            {"job_id": j.job_id, "current": format_cpu_list(j.current), "threads": list(j.threads),
             "steps_per_s": list(j.steps_per_s)} for j in self.jobs],
            "problems": list(self.problems)}
        if self.held is not None:
            d["held"] = self.held
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "NodeReport":
        d = decode_json_bounded(raw, max_bytes=MAX_FEED_BYTES, max_depth=4)
        try:
            jobs = tuple(JobReport(job_id=check_job_id(j["job_id"]),
                                   current=parse_cpu_list(str(j["current"])),
                                   threads=tuple(int(t) for t in j["threads"][:4096]),
                                   steps_per_s=tuple(float(v) for v in j["steps_per_s"][:4096]))
                         for j in d.get("jobs", [])[:MAX_JOBS_PER_NODE])
            problems = tuple(str(p)[:1024] for p in d.get("problems", [])[:MAX_JOBS_PER_NODE])
            held = str(d["held"])[:1024] if d.get("held") is not None else None
        except (KeyError, TypeError, ValueError, OverflowError) as exc:   # int(inf) overflows
            raise ProtocolError(f"bad node report: {exc}") from None
        return cls(node=_node(d), jobs=jobs, problems=problems, held=held)
