"""Small helpers shared by the integration tests."""
from __future__ import annotations

import json
import time
from pathlib import Path

from malleable_protocol import parse_cpu_list
from malleable_protocol.records import MAX_RECORD_BYTES
from malleable_protocol.safe_io import read_bounded


def wait_for(pred, timeout=30.0, what="condition", show=None):
    """Poll ``pred`` until it returns something true; on timeout, say what and ``show()``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}" + (f": {show()}" if show else ""))


def rank_statuses(folder: Path, pattern: str = "rank_*.json") -> dict[int, dict]:
    """The malleable_tf status records in ``folder``, by rank (files being replaced are skipped);
    the CPU lists as sorted lists of ids."""
    out = {}
    for f in folder.glob(pattern):
        try:   # the job's user may have planted links, FIFOs or huge files here
            d = json.loads(read_bounded(f, MAX_RECORD_BYTES))
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and "rank" in d:
            for key in ("allowed_cpus", "share_cpus"):
                d[key] = sorted(parse_cpu_list(d.get(key, "")))
            out[d["rank"]] = d
    return out


def cgroup_cpus(node: str, job_id: int, step: str = "", uid: int = 0) -> frozenset[int] | None:
    """The CPUs of a job's cpuset folder on ``node`` (or of its ``step`` folder); None when the
    folder does not exist."""
    p = Path(f"/sys/fs/cgroup/cpuset/slurm_{node}/uid_{uid}/job_{job_id}") / step / "cpuset.cpus"
    try:
        return parse_cpu_list(p.read_text())
    except OSError:
        return None
