"""The Slurm client: one small interface, and its backend over Slurm's own commands.

Everything the co-scheduler, the launcher and the tests ask of Slurm goes through
``SlurmClient``. ``CliSlurmClient`` runs the real commands through the project's single
command runner; ``make_client`` picks pyslurm only where it matches the installed Slurm.
"""
from __future__ import annotations

import enum
import re
import signal as _signal
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Mapping, Protocol, Sequence

from malleable_protocol.errors import FixableError
from malleable_protocol.runner import CommandError, CommandRunner, run_command
from slurm_plugin.slurm.model import ControllerConfig, Job, JobState, Node
from slurm_plugin.slurm.parsers import (parse_controller_config, parse_nodes_json, parse_sacct_comments,
                      parse_sbatch_parsable, parse_scontrol_ping, parse_slurm_version,
                      parse_squeue_json, SlurmParseError)

# Printable, single-line; Slurm stores comments as plain strings.
_COMMENT_RE = re.compile(r"^[\x20-\x7e]{0,1024}$")


class SlurmClientError(FixableError, RuntimeError):
    pass


class UnknownJob(SlurmClientError):
    def __init__(self, job_id: int):
        super().__init__(f"no such Slurm job: {job_id}")
        self.job_id = job_id


class SignalTarget(enum.Enum):
    STEPS = "steps"   # the tasks of every step (scancel default)
    BATCH = "batch"   # only the batch shell (scancel -b)
    FULL = "full"     # batch shell and steps (scancel -f)


def validate_job_id(job_id: object) -> int:
    """A job id is a positive integer; anything else is refused before any command runs."""
    if isinstance(job_id, bool):
        raise ValueError(f"invalid job id {job_id!r}")
    if isinstance(job_id, int):
        value = job_id
    elif isinstance(job_id, str) and job_id.isdigit():
        value = int(job_id)
    else:
        raise ValueError(f"invalid job id {job_id!r}: must be a positive integer")
    if not 0 < value < 2**32:
        raise ValueError(f"invalid job id {job_id!r}: out of range")
    return value


class SlurmClient(Protocol):
    def ping(self) -> bool: ...
    def nodes(self) -> list[Node]: ...
    def jobs(self, *, node: str | None = None, states: Iterable[JobState] | None = None,
             layout: Sequence[Node] | None = None) -> list[Job]: ...
    def job(self, job_id: int) -> Job: ...
    def set_comment(self, job_id: int, comment: str, *, admin: bool = False) -> None: ...
    def signal(self, job_id: int, sig: _signal.Signals,
               target: SignalTarget = SignalTarget.STEPS) -> None: ...
    def submit(self, script: Path, args: Sequence[str] = ()) -> int: ...
    def cancel(self, job_id: int) -> None: ...


# From 23.02, sinfo --json groups nodes by state; scontrol (which has --json from then on) still
# prints one record per node.
NODES_FROM_SCONTROL = (23, 2)
# Slurm's JSON changes with each data_parser version; from 24.11 (v0.0.40 to 42) to 26.05 (v0.0.42
# to 45) every release has v0.0.42, the one this code reads, so it is asked for by name and the
# answer must name it. Before 24.11 the default is read (22.05's; 23.02 to 24.05 untested).
DATA_PARSER = "v0.0.42"
DATA_PARSER_FROM = (24, 11)


class JobAccounting(Protocol):
    """Slurm's accounting database (slurmdbd), where a finished job can still be annotated."""

    def system_comments(self, job_ids: Sequence[int]) -> dict[int, str]: ...
    def set_system_comments(self, texts: Mapping[int, str]) -> None: ...


def _abstract_ids(cores: frozenset[tuple[int, int]], node: Node) -> frozenset[int]:
    try:
        return node.layout.abstract_ids(cores)
    except ValueError as exc:
        raise SlurmParseError(f"node {node.name}: {exc}") from None


class CliSlurmClient:
    """``SlurmClient`` over squeue, sinfo, scontrol, scancel and sbatch."""

    backend = "cli"

    def __init__(self, runner: CommandRunner = run_command, *, slurm_conf: Path | None = None,
                 env: dict[str, str] | None = None, timeout_s: float = 20.0,
                 slurm_version: tuple[int, int] | None = None):
        """``env`` is added to every command's environment (sbatch passes it on to the job).
        ``slurm_version`` picks the commands whose JSON differs between versions; None reads it
        from ``sinfo --version`` at the first such call."""
        self._run = runner
        self._version = slurm_version
        merged = dict(env or {})
        if slurm_conf:
            merged["SLURM_CONF"] = str(slurm_conf)
        self._env = merged or None
        self._timeout = timeout_s

    def _cmd(self, args: Sequence[str]) -> str:
        return self._run(list(args), timeout=self._timeout, env=self._env).stdout

    def ping(self) -> bool:
        try:
            return parse_scontrol_ping(self._cmd(["scontrol", "ping"]))
        except CommandError:
            return False

    def slurm_version(self) -> tuple[int, int]:
        """(major, minor) of the Slurm its commands belong to, read once."""
        if self._version is None:
            # Through _cmd: without a slurm.conf where Slurm looks, even --version needs SLURM_CONF.
            self._version = parse_slurm_version(self._cmd(["sinfo", "--version"]))
        return self._version

    def _data_parser(self) -> str | None:
        return DATA_PARSER if self.slurm_version() >= DATA_PARSER_FROM else None

    def _json(self) -> str:
        """The --json option: with the pinned data_parser where the release has it."""
        pinned = self._data_parser()
        return f"--json={pinned}" if pinned else "--json"

    def nodes(self) -> list[Node]:
        if self.slurm_version() >= NODES_FROM_SCONTROL:
            return parse_nodes_json(self._cmd(["scontrol", "show", "nodes", self._json()]),
                                    "scontrol show nodes --json", self._data_parser())
        return parse_nodes_json(self._cmd(["sinfo", self._json()]))

    def jobs(self, *, node: str | None = None, states: Iterable[JobState] | None = None,
             layout: Sequence[Node] | None = None) -> list[Job]:
        """Every job (one REQUEST_JOB_INFO). The CPU ids of each job's cores need the nodes'
        layout: pass ``layout`` (from an earlier ``nodes()``) to save the sinfo call."""
        jobs = parse_squeue_json(self._cmd(["squeue", self._json()]), self._data_parser())
        wanted = set(states) if states is not None else None
        if wanted is not None:
            jobs = [j for j in jobs if j.state in wanted]
        if node is not None:
            jobs = [j for j in jobs if node in j.nodes]
        return self._with_cpu_ids(jobs, layout)

    def _with_cpu_ids(self, jobs: list[Job], nodes: Sequence[Node] | None = None) -> list[Job]:
        if not any(j.cores for j in jobs):
            return jobs
        layout = {n.name: n for n in (self.nodes() if nodes is None else nodes)}
        out = []
        for j in jobs:
            ids = {name: _abstract_ids(cores, layout[name])
                   for name, cores in j.cores.items() if name in layout}
            out.append(replace(j, cpu_ids=ids))
        return out

    def job(self, job_id: int) -> Job:
        job_id = validate_job_id(job_id)
        try:
            found = parse_squeue_json(self._cmd(["squeue", self._json(), "--jobs", str(job_id)]),
                                      self._data_parser())
        except CommandError as exc:
            if "Invalid job id" in exc.stderr:
                raise UnknownJob(job_id) from exc
            raise
        found = [j for j in found if j.job_id == job_id]
        if not found:
            raise UnknownJob(job_id)
        return self._with_cpu_ids(found[:1])[0]

    def set_comment(self, job_id: int, comment: str, *, admin: bool = False) -> None:
        job_id = validate_job_id(job_id)
        if not _COMMENT_RE.match(comment):
            raise ValueError("a comment must be printable ASCII on one line, at most 1024 chars")
        key = "AdminComment" if admin else "Comment"
        self._update(job_id, [f"{key}={comment}"])

    def _update(self, job_id: int, fields: list[str]) -> None:
        try:
            self._cmd(["scontrol", "update", f"JobId={job_id}", *fields])
        except CommandError as exc:
            if "Invalid job id" in exc.stderr:
                raise UnknownJob(job_id) from exc
            raise

    def controller_config(self) -> ControllerConfig:
        """What the watcher needs of slurmctld's configuration, from one ``scontrol show
        config``."""
        return parse_controller_config(self._cmd(["scontrol", "show", "config"]))

    def system_comments(self, job_ids: Sequence[int]) -> dict[int, str]:
        """The SystemComment of each job the accounting database has a record of (a job it
        does not know yet is left out), from one ``sacct`` call whatever the number of jobs."""
        ids = sorted({validate_job_id(j) for j in job_ids})
        if not ids:
            return {}
        out = self._cmd(["sacct", "-X", "-n", "-P", "-j", ",".join(map(str, ids)),
                         "-o", "JobIDRaw,SystemComment"])
        return {j: c for j, c in parse_sacct_comments(out).items() if j in ids}

    def set_system_comments(self, texts: Mapping[int, str]) -> None:
        """Written into the database by one ``sacctmgr`` process (root, SlurmUser or an
        operator) reading a ``modify job`` line per job on its standard input: one process and
        one slurmdbd connection whatever the number of jobs. SystemComment is the one field of a
        finished job that the site's accounting shows and only an administrator writes.
        sacctmgr goes on past a job it cannot modify, so the caller reads the comments back to
        know which were written."""
        lines = []
        for job_id, text in sorted(texts.items()):
            job_id = validate_job_id(job_id)
            if not _COMMENT_RE.match(text) or set(text) & set("'\"\\`"):
                raise ValueError("a SystemComment must be printable ASCII on one line without "
                                 "quotes or backslashes, at most 1024 chars")
            # sacctmgr splits its input lines on blanks outside quotes and strips the quotes.
            lines.append(f'modify job where jobid={job_id} set SystemComment="{text}"\n')
        if lines:
            self._run(["sacctmgr", "-i"], timeout=self._timeout, env=self._env,
                      input="".join(lines))

    def signal(self, job_id: int, sig: _signal.Signals,
               target: SignalTarget = SignalTarget.STEPS) -> None:
        job_id = validate_job_id(job_id)
        sig = _signal.Signals(sig)
        flags = {SignalTarget.STEPS: [], SignalTarget.BATCH: ["--batch"],
                 SignalTarget.FULL: ["--full"]}[target]
        self._cmd(["scancel", f"--signal={sig.name.removeprefix('SIG')}", *flags, str(job_id)])

    def submit(self, script: Path, args: Sequence[str] = ()) -> int:
        return parse_sbatch_parsable(self._cmd(["sbatch", "--parsable", *args, str(script)]))

    def cancel(self, job_id: int) -> None:
        self._cmd(["scancel", str(validate_job_id(job_id))])


def pyslurm_unusable_reason(slurm_version: tuple[int, int]) -> str | None:
    """Why pyslurm cannot serve this Slurm, or None when it can.

    pyslurm's version follows Slurm's (25.11.x needs Slurm 25.11), so the two must share their
    major.minor. No pyslurm for Slurm 22.05 can be installed from PyPI (see docs/FACTS).
    """
    try:
        import pyslurm  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError, or pyslurm's version mismatch
        return f"pyslurm does not import ({exc.__class__.__name__}: {exc})"
    m = re.match(r"(\d+)\.(\d+)", getattr(pyslurm, "__version__", ""))
    if not m or (int(m[1]), int(m[2])) != slurm_version:
        return (f"pyslurm {getattr(pyslurm, '__version__', '?')} does not match Slurm "
                f"{slurm_version[0]}.{slurm_version[1]:02d}")
    return ("pyslurm matches, but this project has no pyslurm backend yet: "
            "the CLI backend serves every call")


def make_client(runner: CommandRunner = run_command, *, slurm_conf: Path | None = None
                ) -> tuple[SlurmClient, str]:
    """The client to use, and a one-line reason for the choice."""
    client = CliSlurmClient(runner, slurm_conf=slurm_conf)
    reason = pyslurm_unusable_reason(client.slurm_version())
    return client, f"Slurm CLI backend: {reason}"
