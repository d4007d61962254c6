"""Pure parsers of Slurm 22.05 command output. Tested on captured output in tests/fixtures."""
from __future__ import annotations

import json
import re

from ..cpulist import parse_cpu_list
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


def parse_squeue_json(text: str) -> list[Job]:
    """Jobs from ``squeue --json`` (openapi v0.0.38). CPU ids are not in it: see
    ``parse_scontrol_cpu_ids``."""
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
            ))
        except (KeyError, TypeError, ValueError) as exc:
            raise SlurmParseError(f"unexpected job record in squeue --json: {exc}") from exc
    return jobs


_JOBID = re.compile(r"^JobId=(\d+)\s")
# Detail lines of `scontrol show job -d`: one group of nodes sharing the same CPU ids.
_CPU_IDS = re.compile(r"(?:^|\s)Nodes=(\S+) CPU_IDs=(\S+)")


def parse_scontrol_cpu_ids(text: str) -> dict[int, dict[str, frozenset[int]]]:
    """Per job id, per node, the allocated CPU ids, from ``scontrol show job -d -o``."""
    out: dict[int, dict[str, frozenset[int]]] = {}
    for line in text.splitlines():
        m = _JOBID.match(line)
        if not m:
            continue
        per_node: dict[str, frozenset[int]] = {}
        for nodes_expr, ids in _CPU_IDS.findall(line):
            try:
                cpus = parse_cpu_list(ids)
                names = expand_hostlist(nodes_expr)
            except ValueError as exc:
                raise SlurmParseError(f"job {m[1]}: bad node or CPU list: {exc}") from exc
            for name in names:
                per_node[name] = cpus
        out[int(m[1])] = per_node
    return out


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
                hostname=str(n.get("hostname", "")),
                port=int(n.get("port", 0) or 0),
            ))
        except (KeyError, TypeError, ValueError) as exc:
            raise SlurmParseError(f"unexpected node record in sinfo --json: {exc}") from exc
    return nodes


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
