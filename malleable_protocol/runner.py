"""The one place where the project runs external commands.

Every call takes an argument list (never a shell string) and a timeout, and a failure raises a
typed error that carries the command, its exit code and its stderr. Code that needs to run
commands takes a ``CommandRunner`` so tests of pure logic can inject a recording fake.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence
from .errors import FixableError

DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class CommandResult:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandError(FixableError, RuntimeError):
    """An external command failed: it exited non-zero, timed out, or could not be started."""

    def __init__(self, args: Sequence[str], returncode: int | None, stderr: str, reason: str = ""):
        self.args_list = tuple(args)
        self.returncode = returncode
        self.stderr = stderr
        self.reason = reason or f"exit code {returncode}"
        detail = stderr.strip().splitlines()[-5:] if stderr.strip() else []
        msg = f"command {' '.join(self.args_list)!r} failed: {self.reason}"
        if detail:
            msg += ": " + " | ".join(detail)
        super().__init__(msg)


class CommandTimeout(CommandError):
    pass


class CommandNotFound(CommandError):
    pass


class CommandRunner(Protocol):
    def __call__(
        self,
        args: Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        check: bool = True,
    ) -> CommandResult: ...


def run_command(
    args: Sequence[str],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    check: bool = True,
) -> CommandResult:
    """Run ``args`` and return its output; raise ``CommandError`` on failure when ``check``.

    ``env`` entries are added to (not substituted for) the current environment.
    """
    if isinstance(args, (str, bytes)):
        raise TypeError("run_command takes an argument list, not a shell string")
    argv = [str(a) for a in args]
    full_env = None
    if env is not None:
        full_env = dict(os.environ)
        full_env.update(env)
    try:
        proc = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            # Slurm passes users' bytes through (a job name of b"\xff" in squeue --json): a
            # strict decode would fail every call while such a job exists.
            errors="replace",
            timeout=timeout,
            env=full_env,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise CommandNotFound(argv, None, str(exc), reason=f"{argv[0]} not found on PATH") from exc
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise CommandTimeout(argv, None, stderr, reason=f"timed out after {timeout:g}s") from exc
    result = CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise CommandError(argv, proc.returncode, proc.stderr)
    return result
