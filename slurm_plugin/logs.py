"""The one logging set-up of the node side's commands (agent, watcher, containers, hooks).

Everything goes to stderr, one line per record naming the component (``agent[n1]``,
``watcher``, ...): under systemd, journald keeps it (``journalctl -u malleable-agent@n1``); in the
local cluster, the daemon's log file. The files the agent writes itself (its event log,
``hooks-<node>.log``) are not logs in this sense and are capped where they are written.
"""
from __future__ import annotations

import faulthandler
import logging
import signal
import sys

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# What a daemon (agent, watcher) that seems stuck is sent to print every thread's Python stack
# on stderr (its log): ``systemctl kill -s USR2 malleable-agent@n1``, and the local cluster's
# report of a failed test.
STACKS_SIGNAL = signal.SIGUSR2
FORMAT = "%(asctime)s %(levelname)s {component}: %(message)s"


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (as ``logging.lastResort``
    does), not the stream of the moment it was made."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def level_of(name: str | int) -> int:
    """``"DEBUG"``, ``"info"``, ... or a ``logging`` level number; ``ValueError`` otherwise."""
    if isinstance(name, int) and not isinstance(name, bool):
        return name
    if isinstance(name, str) and name.upper() in LEVELS:
        return getattr(logging, name.upper())
    raise ValueError(f"not a log level: {name!r} (one of {', '.join(LEVELS)})")


def setup_logging(component: str, level: str | int = "INFO") -> logging.Handler:
    """Root's records at ``level`` and above to stderr, formatted with ``component``. Called
    again (a test, or one process running two commands), it replaces its own handler, never
    anyone else's. Returns the handler."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_malleable", False)]:
        root.removeHandler(old)
    handler = _Stderr()
    handler._malleable = True
    handler.setFormatter(logging.Formatter(FORMAT.format(component=component.replace("%", "%%"))))
    root.addHandler(handler)
    root.setLevel(level_of(level))
    return handler


def add_log_level_option(parser, default: str = "INFO") -> None:
    """``--log-level`` on a command's parser."""
    parser.add_argument("--log-level", default=default, type=str.upper, choices=LEVELS,
                        help="the least severe records logged to stderr (default %(default)s)")


def dump_stacks_on_signal(signum: int = STACKS_SIGNAL) -> None:
    """Every thread's Python stack to stderr when ``signum`` comes (faulthandler writes from
    the signal handler, without the GIL: a daemon whose threads are all stuck still answers)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):    # stderr replaced by a capture: the process's
        fd = 2
    faulthandler.register(signum, file=fd, all_threads=True, chain=False)
