"""The one base of every error a user or an admin can fix (a bad request, a missing file, Slurm
refusing): a command prints its message as one line and exits 1. Any other exception is a bug
and keeps its traceback."""
from __future__ import annotations


class FixableError(Exception):
    """What went wrong and what to do, in the message; raised where the cause is known."""
