"""The node's event logs: the agent's (one JSON object a line: cycles, resizes, job usage) and
the hooks' (Prolog, Epilog, step start). Each is capped, then one older file is kept, so a node
holds at most twice the cap of them on /run whatever its jobs do."""
from __future__ import annotations

from pathlib import Path

from malleable_protocol.safe_io import append_capped

MAX_LOG_BYTES = 8 << 20     # the event log, then one older file: 16 MiB at most on /run


def append_event(path: Path, text: str) -> None:
    """One line (``text`` without its newline) at the end of the log at ``path``."""
    append_capped(path, text + "\n", MAX_LOG_BYTES)
