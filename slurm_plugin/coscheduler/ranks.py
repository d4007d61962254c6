"""Reads the status records of a job's ranks. They are untrusted input: the job's folder and
each record are opened without following links or blocking, must be owned by the job's user,
are bounded in size and depth, and a record is believed only for a live process of that user in
the job's cgroup on this node."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from malleable_protocol import ProtocolError, RankStatus, RunLayout
from malleable_protocol.records import MAX_RECORD_BYTES
from malleable_protocol.safe_io import list_bounded, open_dir, read_bounded

from .model import RankView

MAX_RANK_FILES = 1024


def process_uid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f.read(8192).splitlines():
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def in_job_cgroup(pid: int, job_id: int, node: str, uid: int) -> bool:
    """True when ``pid`` is a process of ``uid`` in ``job_id``'s cgroup on ``node`` (several
    slurmd may share one machine, and so one /proc)."""
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            text = f.read(65536).decode(errors="replace")
    except OSError:
        return False
    marks = (f"/slurm_{node}/", f"/{node}_slurmstepd.scope/")
    inside = any(f"/job_{job_id}/" in line + "/" and any(m in line for m in marks)
                 for line in text.splitlines())
    return inside and process_uid(pid) == uid


PidCheck = Callable[[int, int, str, int], bool]


def read_job_ranks(layout: RunLayout, job_id: int, uid: int, node: str, *,
                   check_pid: PidCheck = in_job_cgroup) -> tuple[RankView, ...]:
    """The records of ``job_id``'s ranks that run on ``node``; bad ones are skipped."""
    try:
        jobs_fd = open_dir(layout.jobs_dir)
    except OSError:
        return ()
    try:
        try:
            dfd = open_dir(layout.job_dir(job_id).name, dir_fd=jobs_fd)
        except OSError:
            return ()
        try:
            if os.fstat(dfd).st_uid != uid:
                return ()     # not the folder the Prolog made for this job's user
            names = [n for n in list_bounded(dfd, MAX_RANK_FILES)
                     if RunLayout.parse_status_name(n) is not None]
            out = []
            for name in sorted(names):
                try:
                    st = RankStatus.decode(read_bounded(name, MAX_RECORD_BYTES, dir_fd=dfd,
                                                        owner=uid))
                except (OSError, ProtocolError):
                    continue
                if check_pid(st.pid, job_id, node, uid):
                    out.append(RankView(pid=st.pid, rank=st.rank, local_rank=st.local_rank,
                                        local_size=st.local_size,
                                        intra_active=st.intra_active,
                                        steps_per_s=dict(st.steps_per_s),
                                        steps=st.steps))
            return tuple(out)
        finally:
            os.close(dfd)
    finally:
        os.close(jobs_fd)


def read_job_statuses(layout: RunLayout, job_id: int) -> list[RankStatus]:
    """Every readable record of a job, for display (``malleable status``): no pid check."""
    folder = layout.job_dir(job_id)
    out = []
    try:
        dfd = open_dir(folder)
    except OSError:
        return out
    try:
        for name in sorted(list_bounded(dfd, MAX_RANK_FILES)):
            if RunLayout.parse_status_name(name) is None:
                continue
            try:
                out.append(RankStatus.decode(read_bounded(name, MAX_RECORD_BYTES, dir_fd=dfd)))
            except (OSError, ProtocolError):
                continue
    finally:
        os.close(dfd)
    return out
