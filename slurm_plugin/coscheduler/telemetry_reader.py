"""Reads the status records that malleable_tf ranks write. They are untrusted input: bounded in
size, validated field by field, and believed only for processes inside the job's cgroup."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MAX_BYTES = 16384
MAX_FILES = 1024


@dataclass(frozen=True)
class RankStatus:
    pid: int
    rank: int
    intra_active: int
    intra_pool: int
    steps_per_s: dict[int, float]


def status_dir(base: Path, job_id: int) -> Path:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
        raise ValueError(f"invalid job id {job_id!r}")
    return base / f"job_{job_id}"


def parse_status(raw: bytes) -> RankStatus:
    if len(raw) > MAX_BYTES:
        raise ValueError("status record too large")
    d = json.loads(raw)
    if not isinstance(d, dict):
        raise ValueError("status record is not an object")

    def num(key, lo=0, hi=2**31):
        v = d.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"bad {key}")
        return v

    rates = d.get("steps_per_s", {})
    if not isinstance(rates, dict) or len(rates) > 256:
        raise ValueError("bad steps_per_s")
    clean = {}
    for k, v in rates.items():
        if not (isinstance(k, str) and k.isdigit()) or isinstance(v, bool) or \
                not isinstance(v, (int, float)) or not 0 <= v < 1e9:
            raise ValueError("bad steps_per_s entry")
        clean[int(k)] = float(v)
    return RankStatus(pid=num("pid", 1), rank=num("rank"), intra_active=num("intra_active", 1, 4096),
                      intra_pool=num("intra_pool", 1, 4096), steps_per_s=clean)


def in_job_cgroup(pid: int, job_id: int, node: str) -> bool:
    """True when ``pid`` runs in ``job_id``'s cgroup on ``node`` (several slurmd may share one
    machine, and so one /proc)."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    marks = (f"/slurm_{node}/", f"/{node}_slurmstepd.scope/")
    return any(f"/job_{job_id}/" in line + "/" and any(m in line for m in marks)
               for line in text.splitlines())


def read_job_ranks(base: Path, job_id: int, node: str, *,
                   check_pid=in_job_cgroup) -> list[RankStatus]:
    """The status records of ``job_id``'s ranks that run on ``node``."""
    folder = status_dir(base, job_id)
    out = []
    try:
        files = sorted(folder.glob("*.json"))[:MAX_FILES]
    except OSError:
        return []
    for f in files:
        try:
            if f.is_symlink() or not f.is_file():
                continue
            with open(f, "rb") as fh:
                st = parse_status(fh.read(MAX_BYTES + 1))
        except (OSError, ValueError):
            continue
        if check_pid(st.pid, job_id, node):
            out.append(st)
    return out
