"""Pure parsers of Slurm 22.05 command output. Tested on captured output in tests/fixtures."""
from __future__ import annotations

import json
import re

from .hostlist import expand_hostlist
from .model import Job, JobState, Node


class SlurmParseError(ValueError):
    pass


def _load_json(text: str, what: str) -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(f"{what} did not print JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise SlurmParseError(f"{what} printed JSON that is not an object")
    errors = data.get("errors") or []
    if errors:
        raise SlurmParseError(f"{what} reported errors: {errors}")
    return data


def _allocated_cores(job: dict) -> dict[str, frozenset[tuple[int, int]]]:
    """Per node, the (socket, core) pairs of ``job_resources.allocated_nodes``.

    The JSON is the source of truth for a job's cores: ``scontrol show job -d`` prints the same
    ids, but as free text in which a user's job name or comment can imitate them.
    """
    res = job.get("job_resources") or {}
    out: dict[str, frozenset[tuple[int, int]]] = {}
    for entry in res.get("allocated_nodes") or []:
        pairs = set()
        for sock_id, sock in (entry.get("sockets") or {}).items():
            for core_id, status in (sock.get("cores") or {}).items():
                if status == "allocated":
                    pairs.add((int(sock_id), int(core_id)))
        out[str(entry["nodename"])] = frozenset(pairs)
    return out


def parse_squeue_json(text: str) -> list[Job]:
    """Jobs from ``squeue --json`` (openapi v0.0.38), with each node's allocated cores as
    (socket, core) pairs; ``cpu_ids_of`` turns them into CPU ids."""
    data = _load_json(text, "squeue --json")
    jobs = []
    for j in data.get("jobs", []):
        try:
            jobs.append(Job(
                job_id=int(j["job_id"]),
                name=str(j.get("name", "")),
                user=str(j.get("user_name", "")),
                uid=int(j.get("user_id", -1)),
                state=JobState.parse(str(j.get("job_state", ""))),
                partition=str(j.get("partition", "")),
                nodes=tuple(expand_hostlist(str(j.get("nodes", "")))),
                num_cpus=int(j.get("cpus", 0)),
                comment=str(j.get("comment", "") or ""),
                admin_comment=str(j.get("admin_comment", "") or ""),
                cores=_allocated_cores(j),
            ))
        except (KeyError, TypeError, ValueError) as exc:
            raise SlurmParseError(f"unexpected job record in squeue --json: {exc}") from exc
    return jobs


def parse_sinfo_json(text: str) -> list[Node]:
    data = _load_json(text, "sinfo --json")
    nodes = []
    for n in data.get("nodes", []):
        try:
            nodes.append(Node(
                name=str(n["name"]),
                state=str(n.get("state", "")).lower(),
                state_flags=tuple(str(f) for f in n.get("state_flags", []) or []),
                cpus=int(n.get("cpus", 0)),
                alloc_cpus=int(n.get("alloc_cpus", 0)),
                partitions=tuple(n.get("partitions", []) or []),
                sockets=int(n.get("sockets", 1) or 1),
                cores_per_socket=int(n.get("cores", 1) or 1),
                threads_per_core=int(n.get("threads", 1) or 1),
                hostname=str(n.get("hostname", "")),
                port=int(n.get("port", 0) or 0),
            ))
        except (KeyError, TypeError, ValueError) as exc:
            raise SlurmParseError(f"unexpected node record in sinfo --json: {exc}") from exc
    return nodes


def cpu_ids_of(cores: frozenset[tuple[int, int]], node: Node) -> frozenset[int]:
    """CPU ids of (socket, core) pairs on ``node``, in Slurm's numbering: core index
    socket*cores_per_socket+core, its hyperthreads next to each other. On the machines seen here
    (one socket, one thread per core) this equals the ``CPU_IDs`` of ``scontrol show job -d``."""
    ids = set()
    for sock, core in cores:
        if not (0 <= sock < node.sockets and 0 <= core < node.cores_per_socket):
            raise SlurmParseError(f"core ({sock},{core}) outside node {node.name}'s layout")
        base = (sock * node.cores_per_socket + core) * node.threads_per_core
        ids.update(range(base, base + node.threads_per_core))
    return frozenset(ids)


def parse_scontrol_ping(text: str) -> bool:
    """True when every controller listed by ``scontrol ping`` is UP."""
    states = re.findall(r"\bis (UP|DOWN)\b", text)
    return bool(states) and all(s == "UP" for s in states)


def parse_sbatch_parsable(text: str) -> int:
    """``sbatch --parsable`` prints "JOBID" or "JOBID;CLUSTER"."""
    first = text.strip().split(";", 1)[0]
    if not first.isdigit():
        raise SlurmParseError(f"sbatch --parsable printed {text.strip()!r}, not a job id")
    return int(first)
