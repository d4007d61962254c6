"""Pure parsers of Slurm command output, 22.05 (openapi v0.0.38) and 24.11 (data_parser
v0.0.42). Tested on output captured from each (tests/fixtures/slurm-22.05, slurm-24.11)."""
from __future__ import annotations

import enum

import json
import re

from malleable_protocol.hostlist import expand_hostlist
from slurm_plugin.slurm.model import ControllerConfig, Job, JobState, Node


class SlurmParseError(ValueError):
    pass


# What a malformed record raises on its way: a list where a map belongs has no .get(), and
# int() of a JSON Infinity overflows.
_RECORD_ERRORS = (AttributeError, KeyError, TypeError, ValueError, OverflowError)


def _brief(value: object) -> str:
    """At most 200 characters of ``value`` for a message: the output holds users' text."""
    text = str(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _load_json(text: str, what: str, key: str, data_parser: str | None = None) -> dict:
    """The output's object; ``data_parser``: the version it was asked in, which its
    ``meta.plugin.data_parser`` must name (another would be read with the wrong fields)."""
    try:
        data = json.loads(text)
    # ValueError: a number of over 4300 digits; RecursionError: nesting deeper than Python's stack.
    except (ValueError, RecursionError) as exc:
        raise SlurmParseError(f"{what} did not print JSON: {_brief(exc)}") from None
    if not isinstance(data, dict):
        raise SlurmParseError(f"{what} printed JSON that is not an object")
    errors = data.get("errors") or []
    if errors:
        raise SlurmParseError(f"{what} reported errors: {_brief(errors)}")
    if data_parser is not None:
        meta = data.get("meta")
        plugin = meta.get("plugin") if isinstance(meta, dict) else None
        named = plugin.get("data_parser") if isinstance(plugin, dict) else None
        if not isinstance(named, str) or named.rpartition("/")[2] != data_parser:
            raise SlurmParseError(f"{what} answered in data_parser {_brief(named)}, not the "
                                  f"{data_parser} it was asked for")
    if not isinstance(data.get(key), list):
        # An empty list would read as "no jobs" or "no nodes": a format this code does not know
        # must fail loudly instead (Slurm 23.02's sinfo --json groups nodes, for one).
        raise SlurmParseError(f"{what} printed no '{key}' list "
                              f"(keys: {_brief(', '.join(sorted(data)))})")
    return data


def _number(value: object) -> int:
    """A count: 22.05 prints an int, 24.11 an object {"set": bool, "infinite": bool,
    "number": int}; unset or infinite reads as 0."""
    if isinstance(value, dict):
        return int(value.get("number", 0)) if value.get("set") and not value.get("infinite") else 0
    return int(value or 0)


def _states(value: object) -> tuple[str, ...]:
    """A state and its flags: "RUNNING" (22.05) or ["RUNNING", "REQUEUED"] (24.11)."""
    if isinstance(value, list):
        return tuple(str(v) for v in value) or ("",)
    return (str(value or ""),)


def _allocated_cores(job: dict) -> dict[str, frozenset[tuple[int, int]]]:
    """Per node, the (socket, core) pairs Slurm allocated to the job: 22.05's
    ``job_resources.allocated_nodes`` or 24.11's ``job_resources.nodes.allocation``.

    The JSON is the source of truth for a job's cores: ``scontrol show job -d`` prints the same
    ids, but as free text in which a user's job name or comment can imitate them.
    """
    res = job.get("job_resources") or {}
    out: dict[str, frozenset[tuple[int, int]]] = {}
    for entry in res.get("allocated_nodes") or []:                       # 22.05
        pairs = set()
        for sock_id, sock in (entry.get("sockets") or {}).items():
            for core_id, status in (sock.get("cores") or {}).items():
                # A core a running step uses is "allocated_and_in_use" (openapi/v0.0.38).
                if status in ("allocated", "allocated_and_in_use"):
                    pairs.add((int(sock_id), int(core_id)))
        out[str(entry["nodename"])] = frozenset(pairs)
    nodes = res.get("nodes")
    for entry in (nodes.get("allocation") or []) if isinstance(nodes, dict) else []:  # 24.11
        pairs = set()
        for sock in entry.get("sockets") or []:
            for core in sock.get("cores") or []:
                if "ALLOCATED" in _states(core.get("status")):
                    pairs.add((int(sock["index"]), int(core["index"])))
        out[str(entry["name"])] = frozenset(pairs)
    return out


def parse_squeue_json(text: str, data_parser: str | None = None) -> list[Job]:
    """Jobs from ``squeue --json`` (22.05 or 24.11), with each node's allocated cores as
    (socket, core) pairs; ``Node.layout.abstract_ids`` turns them into Slurm's CPU ids."""
    data = _load_json(text, "squeue --json", "jobs", data_parser)
    jobs = []
    for j in data.get("jobs", []):
        try:
            jobs.append(Job(
                job_id=int(j["job_id"]),
                name=str(j.get("name", "")),
                user=str(j.get("user_name", "")),
                uid=int(j.get("user_id", -1)),
                state=JobState.parse(_states(j.get("job_state"))[0]),
                partition=str(j.get("partition", "")),
                nodes=tuple(expand_hostlist(str(j.get("nodes", "")))),
                num_cpus=_number(j.get("cpus", 0)),
                comment=str(j.get("comment", "") or ""),
                admin_comment=str(j.get("admin_comment", "") or ""),
                cores=_allocated_cores(j),
            ))
        except _RECORD_ERRORS as exc:
            raise SlurmParseError(f"unexpected job record in squeue --json: {_brief(exc)}") \
                from None
    return jobs


def parse_nodes_json(text: str, what: str = "sinfo --json",
                     data_parser: str | None = None) -> list[Node]:
    """One record per node: 22.05's ``sinfo --json``, or ``scontrol show nodes --json`` where
    sinfo's JSON groups nodes by state (23.02 and later)."""
    data = _load_json(text, what, "nodes", data_parser)
    nodes = []
    for n in data.get("nodes", []):
        try:
            # 22.05: "idle" and flags apart; 24.11: ["IDLE", "DRAIN"].
            state, *flags = _states(n.get("state"))
            flags += [str(f) for f in n.get("state_flags", []) or []]
            nodes.append(Node(
                name=str(n["name"]),
                state=state.lower(),
                state_flags=tuple(flags),
                cpus=_number(n.get("cpus", 0)),
                alloc_cpus=_number(n.get("alloc_cpus", 0)),
                partitions=tuple(n.get("partitions", []) or []),
                sockets=_number(n.get("sockets", 1)) or 1,
                cores_per_socket=_number(n.get("cores", 1)) or 1,
                threads_per_core=_number(n.get("threads", 1)) or 1,
                hostname=str(n.get("hostname", "")),
                port=_number(n.get("port", 0)),
                address=str(n.get("address", "") or ""),
            ))
        except _RECORD_ERRORS as exc:
            raise SlurmParseError(f"unexpected node record in {what}: {_brief(exc)}") from None
    return nodes


def parse_scontrol_ping(text: str) -> bool:
    """True when every controller listed by ``scontrol ping`` is UP."""
    states = re.findall(r"\bis (UP|DOWN)\b", text)
    return bool(states) and all(s == "UP" for s in states)


def parse_sbatch_parsable(text: str) -> int:
    """``sbatch --parsable`` prints "JOBID" or "JOBID;CLUSTER"."""
    first = text.strip().split(";", 1)[0]
    if not (first.isascii() and first.isdigit() and len(first) <= 10):   # "²".isdigit()
        raise SlurmParseError(f"sbatch --parsable printed {text.strip()!r:.32}, not a job id")
    return int(first)


def parse_slurm_version(text: str) -> tuple[int, int]:
    """(major, minor) from ``sinfo --version`` ("slurm-wlm 22.05.8", "slurm 24.11.5")."""
    m = re.search(r"(?<![0-9])([0-9]{1,9})\.([0-9]{1,9})", text)   # int() of 4301 digits fails
    if not m:
        raise SlurmParseError(f"cannot read the Slurm version from {text.strip()!r:.32}")
    return int(m[1]), int(m[2])


def parse_config_value(text: str, key: str) -> str | None:
    """The value of ``key`` in ``scontrol show config`` ("AccountingStorageType   = x");
    None when it is not listed."""
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            return value.strip()
    return None


def parse_config_values(text: str, key: str) -> list[str]:
    """Every value of ``key`` in ``scontrol show config``, "(null)" left out: a hook's programs
    are "Prolog = X" in 22.05, "Prolog[0] = X", "Prolog[1] = Y" in 24.11."""
    values = []
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        name = name.strip()
        if sep and (name == key or (name.startswith(key + "[") and name.endswith("]"))):
            if value.strip() and value.strip() != "(null)":
                values.append(value.strip())
    return values


def parse_controller_config(text: str) -> ControllerConfig:
    """``scontrol show config``'s lines the watcher needs: "SlurmUser = slurm(64030)",
    "SlurmctldHost[0] = h1(10.0.0.1)" (the name before the address), "SlurmctldTimeout = 120
    sec". Pure."""
    user = re.fullmatch(r"[^()]*\((\d{1,10})\)", parse_config_value(text, "SlurmUser") or "")
    timeout = re.match(r"(\d{1,6})", parse_config_value(text, "SlurmctldTimeout") or "")
    names = tuple(v.split("(")[0].strip() for v in parse_config_values(text, "SlurmctldHost"))
    return ControllerConfig(
        accounting_storage=parse_config_value(text, "AccountingStorageType"),
        slurm_user_uid=int(user.group(1)) if user else None,
        controllers=tuple(n for n in names if n),
        state_save=parse_config_value(text, "StateSaveLocation"),
        timeout_s=float(timeout.group(1)) if timeout else 120.0)


def parse_sacct_comments(text: str) -> dict[int, str]:
    """``sacct -X -n -P -o JobIDRaw,SystemComment``: each job's comment, the last record's (a
    requeued job has one per run, the latest last). A line that does not start with a job id
    continues the comment before it (a comment with a line break in it, written by an
    administrator)."""
    out: dict[int, str] = {}
    last: int | None = None
    for line in text.splitlines():
        head, sep, comment = line.partition("|")
        if sep and head.isdigit() and head.isascii():
            last = int(head)
            out[last] = comment
        elif last is not None:
            out[last] += "\n" + line
    return out


class AllocationUnit(enum.Enum):
    CORE = "core"        # CR_Core, CR_Core_Memory, CR_Socket*: a job's CPUs are whole cores
    THREAD = "thread"    # CR_CPU, CR_CPU_Memory: a job may get one thread of a core
    UNKNOWN = "unknown"

    @property
    def lending(self) -> str:
        """How the agent lends on a hyperthreaded node under this unit (the doctor's and
        ``malleable cgroups``' words)."""
        if self is AllocationUnit.CORE:
            return ("whole cores (both threads), as Slurm allocates them (SelectTypeParameters "
                    "allocates whole cores)")
        if self is AllocationUnit.THREAD:
            # slurm.conf(5), CR_CPU: with the node's threads declared (the agent requires
            # slurm.conf to describe the node as slurmd -C does), no core goes to two jobs.
            return ("whole cores (both threads), as Slurm allocates them (SelectTypeParameters "
                    "CR_CPU with ThreadsPerCore declared gives no core to two jobs); should a "
                    "job hold part of a core, every job on the node keeps its allocation")
        return ("whole cores (both threads); what Slurm allocates is unknown "
                "(SelectTypeParameters not read): while a job holds part of a core, every job "
                "on the node keeps its allocation")


def allocation_unit(slurm_config: str | None) -> AllocationUnit:
    """What Slurm allocates on hyperthreaded nodes, from SelectTypeParameters (scontrol show
    config). CR_Memory alone allocates whole nodes; anything else unread is unknown."""
    value = parse_config_value(slurm_config or "", "SelectTypeParameters") or ""
    words = {w.strip().upper() for w in value.split(",")}
    if words & {"CR_CORE", "CR_CORE_MEMORY", "CR_SOCKET", "CR_SOCKET_MEMORY"}:
        return AllocationUnit.CORE
    if words & {"CR_CPU", "CR_CPU_MEMORY"}:
        return AllocationUnit.THREAD
    return AllocationUnit.UNKNOWN
