"""The one base of every error a user or an admin can fix (a bad request, a missing file, Slurm
refusing): a command prints its message as one line and exits 1, as it does for an OSError that
names a path (the world refused it). Any other exception is a bug and keeps its traceback."""
from __future__ import annotations


class FixableError(Exception):
    """What went wrong and what to do, in the message; raised where the cause is known."""


def is_fixable(exc: BaseException) -> bool:
    """Whether a command reports ``exc`` in one line (a FixableError, or an OSError naming a
    path: missing, no permission, a full disk) rather than as the bug it otherwise is."""
    return isinstance(exc, FixableError) or (isinstance(exc, OSError)
                                             and exc.filename is not None)


def error_text(exc: BaseException) -> str:
    """An error's message for a person: an OS error as "path: reason"."""
    if isinstance(exc, OSError) and exc.strerror:
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        return f"{where}: {exc.strerror}" if where else exc.strerror
    return str(exc).strip() or type(exc).__name__


def printable(text: str, limit: int = 400) -> str:
    """``text`` as one line of printable ASCII, at most ``limit`` characters: what a job user
    chose (a folder's name, a file system's type, a record's bytes) reaches root's logs and
    terminal, where a newline would forge a line and an escape sequence would drive the
    terminal. Anything else is written as its escape (\\n, \\x1b, \\xe9)."""
    out = "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode("ascii")
                  for c in text[:limit])
    return out[:limit]
