"""Start and stop the daemons of a local cluster, tracked by pid and process start time.

A pid alone can be reused after a process exits; the start time from /proc makes sure ``down``
stops exactly the processes ``up`` started and nothing else.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence


@dataclass(frozen=True)
class DaemonRecord:
    name: str
    pid: int
    start_ticks: int
    argv: tuple[str, ...]
    log: str

    @classmethod
    def from_dict(cls, d: dict) -> "DaemonRecord":
        return cls(name=str(d["name"]), pid=int(d["pid"]), start_ticks=int(d["start_ticks"]),
                   argv=tuple(d["argv"]), log=str(d["log"]))


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    return raw[raw.rindex(")") + 2:].split()


def process_start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22 of stat, counted after comm


def is_running(rec: DaemonRecord) -> bool:
    fields = _stat_fields(rec.pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return int(fields[19]) == rec.start_ticks


def start_daemon(name: str, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> DaemonRecord:
    """Start ``argv`` in its own session, detached from the caller, stdout/stderr to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                env=env)
    ticks = process_start_ticks(proc.pid)
    if ticks is None:
        proc.wait()
        ticks = -1
    # The Popen object is dropped on purpose: the daemon must outlive this process. Zombies of
    # daemons that die while we still run are reaped by reap_children().
    return DaemonRecord(name=name, pid=proc.pid, start_ticks=ticks, argv=tuple(argv), log=str(log))


def reap_children() -> None:
    """Collect exit statuses of our dead child daemons so they do not linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_daemon(rec: DaemonRecord, timeout_s: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``timeout_s``. True when the process is gone."""
    if not is_running(rec):
        return True
    try:
        os.kill(rec.pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reap_children()
        if not is_running(rec):
            return True
        time.sleep(0.05)
    try:
        os.kill(rec.pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    for _ in range(100):
        reap_children()
        if not is_running(rec):
            return True
        time.sleep(0.05)
    return False


def tail(path: str | Path, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.rstrip().splitlines()[-lines:])


def save_records(path: Path, records: Sequence[DaemonRecord]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([asdict(r) for r in records], indent=2))
    os.replace(tmp, path)


def load_records(path: Path) -> list[DaemonRecord]:
    try:
        return [DaemonRecord.from_dict(d) for d in json.loads(path.read_text())]
    except FileNotFoundError:
        return []
