"""The two records of the protocol, with bounded (de)serialisation.

Both sides treat what they read as untrusted: a record over ``MAX_RECORD_BYTES``, nested deeper
than ``MAX_DEPTH``, or with a field of the wrong type or range is refused with ProtocolError (a
ValueError), never anything else.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from signal import SIGRTMAX, SIGRTMIN, SIGUSR1, SIGUSR2
from typing import Any, Mapping

from .cpulist import format_cpu_list, parse_cpu_list

MAX_RECORD_BYTES = 16384
MAX_RANK_RECORDS = 1024       # records one job's folder may hold on a node (root lists no more)
MAX_DEPTH = 4                 # object > steps_per_s/last_resize > value
MAX_THREAD_COUNTS = 256       # steps/s kept for at most this many distinct thread counts
MAX_THREADS = 4096
_THREAD_COUNT = re.compile(r"[0-9]{1,4}")   # ASCII only: "²".isdigit() is True


class ProtocolError(ValueError):
    pass


# A string, or an unterminated one to the end (a lone backslash last included): a match at every
# quote, so ``sub`` never rescans the rest after a failed match (quadratic on '"' + '\\"' * n).
# The brackets after an unterminated quote are in json's string: never nested.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)', re.S)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_INNERMOST = re.compile(rb"\[\]|\{\}")


def _depth_ok(raw: bytes, limit: int) -> bool:
    """True when no JSON container in ``raw`` nests deeper than ``limit`` (strings skipped).
    Checked before json.loads, whose recursion would otherwise end in RecursionError. Each of
    at most ``limit`` passes removes the innermost pairs, in C: a few passes over the bytes,
    never a Python loop per byte. Unpaired brackets count as too deep (not JSON anyway)."""
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", raw))
    for _ in range(limit):
        if not brackets:
            return True
        brackets = _INNERMOST.sub(b"", brackets)
    return not brackets


def decode_json_bounded(raw: bytes, *, max_bytes: int = MAX_RECORD_BYTES,
                        max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    if len(raw) > max_bytes:
        raise ProtocolError(f"record of {len(raw)} bytes (limit {max_bytes})")
    try:
        # UTF-8 only: json.loads would take UTF-16/32 bytes too, in which a quote or bracket
        # byte inside a character fools the byte-level depth check (RecursionError).
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("record is not UTF-8") from None
    if not _depth_ok(raw, max_depth):
        raise ProtocolError(f"record nested deeper than {max_depth}")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("record is not a JSON object")
    return data


def _int(d: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ProtocolError(f"bad {key}: {v!r:.32}")
    return v


def _num(d: Mapping[str, Any], key: str, lo: float, hi: float) -> float:
    v = d.get(key, 0.0)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise ProtocolError(f"bad {key}: {v!r:.32}")
    return float(v)


def is_reload_signal(signo: object) -> bool:
    """Whether ``signo`` may be a rank's reload signal, the one the agent sends it to say "look
    again": SIGUSR1, SIGUSR2 or a real-time signal. Whatever a record says, root sends nothing else
    (no SIGKILL, no SIGTERM)."""
    return isinstance(signo, int) and not isinstance(signo, bool) and (
        signo in (SIGUSR1, SIGUSR2) or SIGRTMIN <= signo <= SIGRTMAX)


def _cpus(d: Mapping[str, Any], key: str) -> frozenset[int]:
    v = d.get(key, "")
    if not isinstance(v, str) or len(v) > 4096:
        raise ProtocolError(f"bad {key}")
    try:
        return parse_cpu_list(v)
    except ValueError as exc:
        raise ProtocolError(f"bad {key}: {exc}") from None


def _encode(d: dict[str, Any]) -> bytes:
    raw = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
    if len(raw) > MAX_RECORD_BYTES:
        raise ProtocolError("record over its size bound")
    return raw


@dataclass(frozen=True)
class Target:
    """What the agent tells the ranks of a job on one node: the cores the job holds there (or is
    about to hold, on a shrink). Each rank caps its allowance with it and takes
    ``rank_share(cpus, local_rank, local_size)`` of the result. ``generation`` grows with every
    write, so a rank can tell a new target from one it has applied."""

    cpus: frozenset[int]
    generation: int = 0

    def encode(self) -> bytes:
        if not self.cpus:
            raise ProtocolError("a target holds at least one core")
        return _encode({"cpus": format_cpu_list(self.cpus), "generation": self.generation})

    @classmethod
    def decode(cls, raw: bytes) -> "Target":
        d = decode_json_bounded(raw)
        cpus = _cpus(d, "cpus")
        if not cpus:
            raise ProtocolError("a target holds at least one core")
        return cls(cpus=cpus, generation=_int(d, "generation", 0, 2**62))


@dataclass(frozen=True)
class ResizeEvent:
    time: float
    intra_before: int
    intra_after: int
    inter_before: int
    inter_after: int
    reason: str
    latency_ms: float


@dataclass(frozen=True)
class RankStatus:
    """One rank's status record (written by the rank, read by the agent and `malleable status`)."""

    pid: int
    rank: int
    local_rank: int
    local_size: int
    intra_active: int
    intra_pool: int
    inter_active: int
    inter_pool: int
    node: str = ""
    allowed_cpus: frozenset[int] = frozenset()
    share_cpus: frozenset[int] = frozenset()
    # Mean steps/s at each intra-op thread count this rank has run with.
    steps_per_s: Mapping[int, float] = field(default_factory=dict)
    steps: int = 0              # steps counted since start (any loop)
    resizes: int = 0
    last_resize: ResizeEvent | None = None
    updated: float = 0.0
    # The signal the rank takes as "look again" (its handler installed before it says so: a
    # real-time signal's default action ends the process); None: send none, it polls. A record
    # without the field is from a runtime that took SIGUSR1.
    reload_signal: int | None = int(SIGUSR1)

    def encode(self) -> bytes:
        if self.reload_signal is not None and not is_reload_signal(self.reload_signal):
            raise ProtocolError(f"bad reload_signal: {self.reload_signal!r:.32}")
        d = asdict(self)
        d["allowed_cpus"] = format_cpu_list(self.allowed_cpus)
        d["share_cpus"] = format_cpu_list(self.share_cpus)
        d["steps_per_s"] = {str(k): round(v, 4) for k, v in
                            sorted(self.steps_per_s.items())[:MAX_THREAD_COUNTS]}
        return _encode(d)

    @classmethod
    def decode(cls, raw: bytes) -> "RankStatus":
        d = decode_json_bounded(raw)
        rates = d.get("steps_per_s", {})
        if not isinstance(rates, dict) or len(rates) > MAX_THREAD_COUNTS:
            raise ProtocolError("bad steps_per_s")
        clean: dict[int, float] = {}
        for k, v in rates.items():
            if not (isinstance(k, str) and _THREAD_COUNT.fullmatch(k)) or \
                    isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e9:
                raise ProtocolError("bad steps_per_s entry")
            clean[int(k)] = float(v)
        last = d.get("last_resize")
        event = None
        if last is not None:
            if not isinstance(last, dict):
                raise ProtocolError("bad last_resize")
            reason = last.get("reason", "")
            if not isinstance(reason, str) or len(reason) > 64:
                raise ProtocolError("bad last_resize reason")
            event = ResizeEvent(
                time=_num(last, "time", 0, 1e12),
                intra_before=_int(last, "intra_before", 1, MAX_THREADS),
                intra_after=_int(last, "intra_after", 1, MAX_THREADS),
                inter_before=_int(last, "inter_before", 1, MAX_THREADS),
                inter_after=_int(last, "inter_after", 1, MAX_THREADS),
                reason=reason, latency_ms=_num(last, "latency_ms", 0, 1e9))
        node = d.get("node", "")
        if not isinstance(node, str) or len(node) > 64:
            raise ProtocolError("bad node")
        local_size = _int(d, "local_size", 1, MAX_THREADS)
        reload_signal = d.get("reload_signal", int(SIGUSR1))
        if reload_signal is not None and not is_reload_signal(reload_signal):
            raise ProtocolError(f"bad reload_signal: {reload_signal!r:.32}")
        return cls(pid=_int(d, "pid", 1, 2**22), rank=_int(d, "rank", 0, 2**24),
                   local_rank=_int(d, "local_rank", 0, local_size - 1), local_size=local_size,
                   intra_active=_int(d, "intra_active", 1, MAX_THREADS),
                   intra_pool=_int(d, "intra_pool", 1, MAX_THREADS),
                   inter_active=_int(d, "inter_active", 1, MAX_THREADS),
                   inter_pool=_int(d, "inter_pool", 1, MAX_THREADS), node=node,
                   allowed_cpus=_cpus(d, "allowed_cpus"), share_cpus=_cpus(d, "share_cpus"),
                   steps_per_s=clean, steps=_int(d, "steps", 0, 2**62) if "steps" in d else 0,
                   resizes=_int(d, "resizes", 0, 2**62) if "resizes" in d else 0,
                   last_resize=event, updated=_num(d, "updated", 0, 1e12),
                   reload_signal=reload_signal)
