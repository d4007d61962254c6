"""The agent's step-start socket: the SPANK plugin asks the node's running agent to bring a
grown (or lending) job back to its allocation and fence it for a starting step, instead of
starting the Python hook (a process, its imports and a cycle: ~170 ms per step).

Root's alone: the socket is in root's state folder (0700) and the agent answers only a peer
whose uid is 0 (SO_PEERCRED). One request per connection, one line each way:

    plugin -> agent:  "step-start <job id> <step folder> <slurmstepd pid>\\n"
    agent -> plugin:  "ok <resizes> <ms>\\n"  or  "refused <why>\\n"

The plugin falls back to the Python hook when nothing listens or no answer comes in time.
The server only queues requests and wakes the agent's loop; the loop runs the cycles
(``serve``), so cycles never run on two threads.
"""
from __future__ import annotations

import logging
import os
import queue
import re
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from malleable_protocol import check_job_id
from malleable_protocol.layout import check_step_name

from slurm_plugin.node.safety import Verdict

log = logging.getLogger(__name__)
MAX_REQUEST_BYTES = 128
_REQUEST = re.compile(rb"step-start ([0-9]{1,10}) (step_[0-9a-z_]{1,16}) ([0-9]{1,10})\n")


@dataclass(frozen=True)
class StepStartRequest:
    job_id: int
    step: str
    stepd_pid: int

    def encode(self) -> bytes:
        return f"step-start {self.job_id} {self.step} {self.stepd_pid}\n".encode()

    @classmethod
    def decode(cls, raw: bytes) -> "StepStartRequest":
        """Exactly one request line; ValueError on anything else."""
        m = _REQUEST.fullmatch(raw)
        if m is None:
            raise ValueError(f"not a step-start request: {raw[:60]!r}")
        return cls(check_job_id(int(m.group(1))), check_step_name(m.group(2).decode()),
                   int(m.group(3)))


def encode_answer(verdict: Verdict) -> bytes:
    if verdict.safe:
        return f"ok {verdict.resizes} {verdict.ms:.0f}\n".encode()
    return refusal("; ".join(verdict.problems))


def refusal(why: str) -> bytes:
    # One line, bounded: the plugin logs it in slurmd's log.
    return ("refused " + " ".join(why.split())[:1000] + "\n").encode(errors="replace")


class PendingStart:
    """A request waiting for the agent's loop; ``answer`` sends the line and hangs up."""

    def __init__(self, request: StepStartRequest, conn: socket.socket):
        self.request = request
        self._conn = conn

    def answer(self, line: bytes) -> None:
        try:
            self._conn.sendall(line)
        except OSError:
            pass       # the plugin gave up waiting and fell back to the hook
        finally:
            self._conn.close()


class StepStartServer:
    """Listens on ``path``; ``start`` binds and starts the accepting thread (never the
    constructor); ``take`` hands the queued requests to the agent's loop; ``wake`` is set on
    each."""

    def __init__(self, path: Path, wake: threading.Event, *, read_timeout_s: float = 1.0):
        self.path = Path(path)
        self._wake = wake
        self._read_timeout_s = read_timeout_s
        self._queue: queue.SimpleQueue[PendingStart] = queue.SimpleQueue()
        self._deferred: list[PendingStart] = []      # the loop's own: no lock needed
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            os.unlink(self.path)        # a socket an earlier agent left
        except FileNotFoundError:
            pass
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(64)
        self._sock = sock
        self._thread = threading.Thread(target=self._accept_loop, name="step-socket",
                                        daemon=True)
        self._thread.start()

    def take(self) -> list[PendingStart]:
        """Requests deferred by the loop first, then those queued since, oldest first."""
        out, self._deferred = self._deferred, []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def defer(self, pending: list[PendingStart]) -> None:
        """Hand ``pending`` back for the loop's next look, ahead of newer requests, and wake
        the loop for it."""
        if pending:
            self._deferred = pending + self._deferred
            self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        for pending in self.take():
            pending.answer(refusal("the agent is stopping"))

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return          # closed by stop()
            try:
                self._receive(conn)
            except Exception as exc:  # noqa: BLE001 - one bad connection never stops the rest
                log.warning("step socket: %s", exc)
                conn.close()

    def _receive(self, conn: socket.socket) -> None:
        pid, uid, _gid = struct.unpack("3i", conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != 0:
            conn.close()        # only root's slurmstepd asks; nobody else is answered
            return
        conn.settimeout(self._read_timeout_s)
        raw = b""
        while not raw.endswith(b"\n") and len(raw) <= MAX_REQUEST_BYTES:
            chunk = conn.recv(MAX_REQUEST_BYTES + 1 - len(raw))
            if not chunk:
                break
            raw += chunk
        try:
            request = StepStartRequest.decode(raw)
        except ValueError as exc:
            conn.sendall(refusal(str(exc)))
            conn.close()
            return
        self._queue.put(PendingStart(request, conn))
        self._wake.set()
