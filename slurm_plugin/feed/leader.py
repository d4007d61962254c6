"""One active watcher where slurmctld has backups: each controller host runs a watcher, and
the one beside the slurmctld in control is active; the others stand by (no polls, no feed link
listening, so every agent's link goes to the active one: the agents try the hosts in order).

Who is in control is what Slurm itself writes: the controller in control writes
``StateSaveLocation/heartbeat`` (two big-endian uint64: the time, the writer's SlurmctldHost
index) every min(SlurmctldTimeout/4, 30) s when there are two controllers or more
(docs/FACTS.md, "Backup controllers"). No RPC to slurmctld. A host knows its index as
slurmctld does: its host name against the SlurmctldHost names, first match.

Where the heartbeat cannot be read or is older than SlurmctldTimeout, the primary's watcher is
the active one (Slurm's own rule before any takeover) and the backups' stand by.
"""
from __future__ import annotations

import enum
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from slurm_plugin.slurm.model import ControllerConfig

_HEARTBEAT = struct.Struct(">QQ")


class Role(enum.Enum):
    ACTIVE = "active"
    STANDBY = "standby"


@dataclass(frozen=True)
class Heartbeat:
    at: float
    index: int


def controller_index(names: tuple[str, ...], hostname: str) -> int | None:
    """This host's SlurmctldHost index, as slurmctld finds its own: the first name equal to the
    host name or its short form. Pure."""
    short = hostname.split(".")[0]
    for i, name in enumerate(names):
        if name in (hostname, short):
            return i
    return None


def parse_heartbeat(data: bytes) -> Heartbeat | None:
    if len(data) < _HEARTBEAT.size:
        return None
    at, index = _HEARTBEAT.unpack_from(data)
    return Heartbeat(float(at), int(index))


def read_heartbeat(state_save: Path) -> Heartbeat | None:
    """The heartbeat file's two numbers; None when it cannot be read (StateSaveLocation is
    root's or SlurmUser's; the watcher runs as root)."""
    try:
        fd = os.open(state_save / "heartbeat", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK |
                     os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return parse_heartbeat(os.read(fd, 64))
    except OSError:
        return None
    finally:
        os.close(fd)


class HeartbeatHung:
    """The heartbeat file did not answer in time (StateSaveLocation on a hung server)."""


class HeartbeatReader:
    """``read_heartbeat`` in a thread of its own, waited for at most ``timeout_s``:
    StateSaveLocation is usually a file system the controllers share (NFS), and a hung server
    must not stop the watcher's loop. While a read hangs no other starts (one thread at most,
    stuck in the kernel until the server answers); meanwhile the answer is ``HeartbeatHung``."""

    def __init__(self, state_save: Path, timeout_s: float = 1.0,
                 read: Callable[[Path], Heartbeat | None] = read_heartbeat):
        self._state_save, self._timeout, self._read = state_save, timeout_s, read
        self._done: threading.Event | None = None
        self._result: list[Heartbeat | None] = []
        # The watcher's loop and its usage closing (usage_runner.py) both ask.
        self._lock = threading.Lock()

    def __call__(self) -> Heartbeat | None | HeartbeatHung:
        with self._lock:
            if self._done is None or self._done.is_set():
                done, result = threading.Event(), []
                self._done, self._result = done, result

                def read() -> None:
                    try:
                        result.append(self._read(self._state_save))
                    finally:
                        done.set()
                # A daemon thread: one stuck in the kernel must not hold the watcher's exit.
                threading.Thread(target=read, name="heartbeat", daemon=True).start()
            done, result = self._done, self._result
        if not done.wait(self._timeout):
            return HeartbeatHung()
        return result[0] if result else None


def decide_role(config: ControllerConfig, mine: int | None,
                heartbeat: Heartbeat | None | HeartbeatHung, now: float,
                current: Role = Role.STANDBY) -> tuple[Role, str]:
    """This host's watcher's role and why; a heartbeat that hangs stands it by (``current`` is
    kept for the callers' logs). Pure."""
    names = config.controllers
    if len(names) <= 1:
        return Role.ACTIVE, "one controller"
    if mine is None:
        return Role.STANDBY, "this host is none of SlurmctldHost " + ",".join(names)
    if isinstance(heartbeat, HeartbeatHung):
        # Who is in control is unknown; a slurmctld on this StateSaveLocation is stalled too,
        # and another may take control: stand by.
        return Role.STANDBY, "the heartbeat in StateSaveLocation does not answer"
    if heartbeat is not None and now - heartbeat.at <= config.timeout_s:
        if heartbeat.index == mine:
            return Role.ACTIVE, f"slurmctld here ({names[mine]}) is in control"
        other = names[heartbeat.index] if heartbeat.index < len(names) \
            else f"index {heartbeat.index}"
        return Role.STANDBY, f"the slurmctld of {other} is in control"
    if mine == 0:
        return Role.ACTIVE, "the primary, and no fresh heartbeat from a backup"
    return Role.STANDBY, "a backup, and no fresh heartbeat naming it"
