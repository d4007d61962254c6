"""The Standard Workload Format as the Parallel Workloads Archive ships it
(https://www.cs.huji.ac.il/labs/parallel/workload/swf.html, version 2.2): one job per line, 18
whitespace-separated numeric fields, -1 where a value is unknown; header comments are lines that
start with ';' ("; MaxProcs: 128"). Logs come as ``.swf`` or gzip-compressed ``.swf.gz``
(recognised by gzip's magic bytes, not by the name). Pure: bytes in, typed records out."""
from __future__ import annotations

import gzip
import re
from dataclasses import dataclass, fields

GZIP_MAGIC = b"\x1f\x8b"


class SWFError(ValueError):
    pass


@dataclass(frozen=True)
class SWFRecord:
    """One line of the log, the archive's 18 fields in order (-1: unknown)."""

    job: int                    # 1  job number
    submit_s: float             # 2  submit time, from the log's start
    wait_s: float               # 3  wait time (the original scheduler's)
    run_s: float                # 4  run time (wall clock, end - start)
    allocated_procs: int        # 5  allocated processors
    avg_cpu_s: float            # 6  average CPU time used (per processor)
    used_memory_kb: float       # 7  used memory (KB per processor)
    requested_procs: int        # 8  requested processors
    requested_time_s: float     # 9  requested time: the user's time limit
    requested_memory_kb: float  # 10 requested memory (KB per processor)
    status: int                 # 11 1 completed, 0 failed, 5 cancelled; 2-4 partial executions
    user: int                   # 12 user id
    group: int                  # 13 group id
    executable: int             # 14 executable (application) number
    queue: int                  # 15 queue number
    partition: int              # 16 partition number
    preceding_job: int          # 17 preceding job number (a dependency)
    think_time_s: float         # 18 think time from the preceding job


_TYPES = tuple(f.type for f in fields(SWFRecord))   # "int" / "float" (postponed annotations)
N_FIELDS = len(_TYPES)

# Statuses of the lines of a checkpointed or swapped job: each partial execution has a line of
# its own besides the job's summary line (which carries status 0, 1 or 5).
PARTIAL_STATUSES = frozenset({2, 3, 4})
CANCELLED = 5


@dataclass(frozen=True)
class SWFHeader:
    """The header comments: ``Key: value`` entries in the order given (a key such as Note may
    repeat), and every other comment line as a note."""

    entries: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()

    def get(self, key: str) -> str | None:
        return next((v for k, v in self.entries if k.lower() == key.lower()), None)

    def number(self, key: str) -> int | None:
        """A numeric entry (MaxProcs, MaxNodes, MaxJobs, MaxRuntime, UnixStartTime...), or None
        where the log does not give it (or gives no number)."""
        value = self.get(key)
        try:
            return int(float(value.split()[0])) if value else None
        except ValueError:
            return None

    def summary(self) -> dict[str, str]:
        """The first value of each key: what a report shows."""
        out: dict[str, str] = {}
        for k, v in self.entries:
            out.setdefault(k, v)
        return out


@dataclass(frozen=True)
class SWFLog:
    header: SWFHeader
    records: tuple[SWFRecord, ...]


_ENTRY = re.compile(r"\s*([A-Za-z][A-Za-z0-9_]*)\s*:\s*(.*?)\s*")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        value = float(text)     # some logs write integral fields as "16.0"
        if not value.is_integer():
            raise ValueError(f"{text!r} is not a whole number") from None
        return int(value)


def parse_swf_text(text: str) -> SWFLog:
    entries: list[tuple[str, str]] = []
    notes: list[str] = []
    records: list[SWFRecord] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith(";"):
            body = line[1:]
            text_ = body.strip()
            # The archive indents an entry's continuation lines under its value (";       the
            # given submit times ...", ";              http://...": not a key "http").
            continued = len(body) - len(body.lstrip()) > 2 and bool(entries)
            m = None if continued else _ENTRY.fullmatch(body)
            if m and not m[2].startswith("//"):
                entries.append((m[1], m[2]))
            elif continued and text_:
                key, value = entries[-1]
                entries[-1] = (key, f"{value} {text_}".strip())
            elif text_:
                notes.append(text_)
            continue
        parts = line.split()
        if len(parts) != N_FIELDS:
            raise SWFError(f"line {lineno}: {len(parts)} fields, an SWF line has {N_FIELDS}")
        try:
            values = [_int(p) if t == "int" else float(p) for p, t in zip(parts, _TYPES)]
        except ValueError as exc:
            raise SWFError(f"line {lineno}: {exc}") from None
        records.append(SWFRecord(*values))
    return SWFLog(SWFHeader(tuple(entries), tuple(notes)), tuple(records))


def read_swf(data: bytes) -> SWFLog:
    """A log as stored: gzip-compressed or plain text (bytes that are not UTF-8 are replaced:
    some headers carry Latin-1 names)."""
    if data[:2] == GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise SWFError(f"a gzip file that does not decompress: {exc}") from None
    return parse_swf_text(data.decode("utf-8", errors="replace"))
