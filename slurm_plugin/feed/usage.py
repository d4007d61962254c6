"""A job's borrowed and lent cores, from its nodes to the site's accounting.

Each node's Epilog writes the job's usage on that node (the ``job-usage`` line of
``slurm_plugin.node.accounting``) to ``<feed_dir>/usage/<job>.<node>.json``. Once Slurm no longer
holds the job's cores anywhere (not even COMPLETING: every node's Epilog has run), the watcher
sums the nodes' files into one ``JobUsage``, writes it into the job's SystemComment in Slurm's
accounting database (what ``sacct -o SystemComment`` shows) where the cluster has slurmdbd,
appends it to ``<feed_dir>/usage.jsonl`` in every case, and removes the files.

Why SystemComment: a finished job cannot be updated through slurmctld (``scontrol update``
refuses it, COMPLETING included), only in the database (``sacctmgr modify job``, by root,
SlurmUser or an operator); the user's Comment is his and sites use AdminComment for their own
tools (jobstats). slurmdbd writes the value into SQL unescaped and sacctmgr 22.05 lowercases it
and turns quotes into backquotes: the text is kept to lowercase printable ASCII without quotes or
backslashes, and an earlier text that is not (slurmctld's own, rarely) is left alone.

Everything here is pure; the store reads and writes the files, the watcher calls sacctmgr.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from malleable_protocol import check_node_name

from slurm_plugin.slurm import Job

MAX_USAGE_BYTES = 4096             # one node's file: a JSON line of a few hundred bytes
MAX_JOB_ID = 4_294_967_294         # Slurm's job ids are 32-bit (NO_VAL excluded)
MAX_CORES = 1 << 16
MAX_CORE_S = 1e15
MAX_TIME = 1e11
SACCT_MARK = "malleable:"
MAX_SYSTEM_COMMENT = 1024          # what this writes back at most (Slurm's field is TEXT)
_SAFE_COMMENT = re.compile(r"^[ -~]*$")   # printable ASCII on one line
_UNSAFE_CHARS = set("'\"\\`")


class UsageError(ValueError):
    pass


@dataclass(frozen=True)
class NodeUsage:
    """One job's cores on one node, as its Epilog closed them."""

    job_id: int
    node: str
    allocation: int
    borrowed_core_s: float
    lent_core_s: float
    start: float
    end: float

    @classmethod
    def decode(cls, data: bytes) -> "NodeUsage":
        """The Epilog's JSON line; raises ``UsageError`` on anything else, within bounds."""
        if len(data) > MAX_USAGE_BYTES:
            raise UsageError(f"usage file of {len(data)} bytes (at most {MAX_USAGE_BYTES})")
        try:
            d = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise UsageError(f"usage file is not JSON: {exc}") from None
        if not isinstance(d, dict) or d.get("event") != "job-usage":
            raise UsageError("usage file is not a job-usage line")
        try:
            node = check_node_name(d.get("node"))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return cls(job_id=_whole(d, "job", 1, MAX_JOB_ID), node=node,
                   allocation=_whole(d, "allocation", 0, MAX_CORES),
                   borrowed_core_s=_real(d, "borrowed_core_s", MAX_CORE_S),
                   lent_core_s=_real(d, "lent_core_s", MAX_CORE_S),
                   start=_real(d, "start", MAX_TIME), end=_real(d, "end", MAX_TIME))


def _whole(d: dict, key: str, lo: int, hi: int) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise UsageError(f"bad {key}: {v!r:.32}")
    return v


def _real(d: dict, key: str, hi: float) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= hi:
        raise UsageError(f"bad {key}: {v!r:.32}")
    return float(v)


@dataclass(frozen=True)
class JobUsage:
    """A job's usage summed over its nodes."""

    job_id: int
    nodes: tuple[NodeUsage, ...]

    @classmethod
    def of(cls, job_id: int, nodes: Iterable[NodeUsage]) -> "JobUsage":
        """Raises ``UsageError`` when a node's usage is another job's or a node comes twice."""
        got = tuple(sorted(nodes, key=lambda u: u.node))
        if not got:
            raise UsageError(f"job {job_id}: no node's usage")
        if any(u.job_id != job_id for u in got):
            raise UsageError(f"job {job_id}: a file holds another job's usage")
        if len({u.node for u in got}) != len(got):
            raise UsageError(f"job {job_id}: a node's usage twice")
        return cls(job_id=job_id, nodes=got)

    @property
    def borrowed_core_s(self) -> float:
        return math.fsum(u.borrowed_core_s for u in self.nodes)

    @property
    def lent_core_s(self) -> float:
        return math.fsum(u.lent_core_s for u in self.nodes)

    def to_json(self, *, sacct: bool) -> dict[str, Any]:
        """The job's line in usage.jsonl; ``sacct``: whether it reached the database."""
        return {"event": "job-usage", "job": self.job_id,
                "borrowed_core_s": round(self.borrowed_core_s, 3),
                "lent_core_s": round(self.lent_core_s, 3),
                "start": min(u.start for u in self.nodes), "end": max(u.end for u in self.nodes),
                "nodes": {u.node: {"allocation": u.allocation,
                                   "borrowed_core_s": round(u.borrowed_core_s, 3),
                                   "lent_core_s": round(u.lent_core_s, 3)} for u in self.nodes},
                "sacct": sacct}

    def sacct_text(self) -> str:
        return (f"{SACCT_MARK}borrowed_core_s={self.borrowed_core_s:.3f},"
                f"lent_core_s={self.lent_core_s:.3f},nodes={len(self.nodes)}")


def system_comment(old: str | None, usage: JobUsage) -> str:
    """The SystemComment to write: ``old`` with an earlier text of ours replaced by the usage.
    Raises ``UsageError`` when ``old`` cannot be written back as it is (quotes, backslashes,
    upper case that sacctmgr 22.05 would lower, too long): it is left alone then."""
    old = old or ""
    if not _SAFE_COMMENT.match(old) or _UNSAFE_CHARS & set(old) or old != old.lower():
        raise UsageError(f"job {usage.job_id}: its SystemComment {old!r:.60} cannot be kept "
                         "through sacctmgr (quotes, backslashes or upper case)")
    kept = [w for w in old.split() if not w.startswith(SACCT_MARK)]
    text = " ".join([*kept, usage.sacct_text()])
    if len(text) > MAX_SYSTEM_COMMENT:
        raise UsageError(f"job {usage.job_id}: its SystemComment would be {len(text)} chars")
    return text


def usage_file_name(job_id: int, node: str) -> str:
    return f"{job_id}.{check_node_name(node)}.json"


def parse_usage_file_name(name: str) -> tuple[int, str] | None:
    """(job id, node) of ``<job>.<node>.json``; None for any other name (a temporary file)."""
    if not name.endswith(".json") or name.startswith("."):
        return None
    job, _, node = name[:-5].partition(".")
    if not job.isascii() or not job.isdigit() or len(job) > 10:
        return None
    try:
        job_id = int(job)
        return (job_id, check_node_name(node)) if 1 <= job_id <= MAX_JOB_ID else None
    except ValueError:
        return None


def jobs_to_close(pending: Iterable[int], jobs: Sequence[Job]) -> list[int]:
    """Of the jobs with usage files, those whose cores Slurm holds nowhere any more (ended, or
    gone from its list): every node's Epilog has run. Sorted, oldest id first."""
    holding = {j.job_id for j in jobs if j.state.holds_cores}
    return sorted(set(pending) - holding)
