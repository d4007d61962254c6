"""The co-scheduler for Docker containers on one host (the seeds' elastic container scheduler).

Containers labelled ``malleable`` (its value in the request grammar of ``request.py`` without the
prefix: ``--label malleable=min=1,max=node,weight=1``) get cores under the same policy code
(``policy.decide``), the same invariants (``check_plan``) and the same ordered executor as Slurm
jobs; the actuator is ``docker update --cpuset-cpus``.

Docker has no Prolog, so admission plays its part: a malleable container is created (``docker
create``), not started; the agent admits it when ``min`` cores are held by no other admitted
container (its allocation, kept until it exits) and starts it only after the plan's shrinks
that free those cores are applied. One that does not fit waits, created, like a pending job.
A container's process follows its cpuset through its affinity mask, which the kernel resets on
every cpuset change: malleable_tf inside needs no mount of the agent's folders.

Pure parts (``parse_inspect``, ``admit``, ``node_snapshot``) are tested on captured ``docker
inspect`` output; ``DockerCli`` is the only code that runs docker.
"""
from __future__ import annotations

import enum
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from malleable_protocol import RunLayout, format_cpu_list, parse_cpu_list
from malleable_protocol.runner import CommandError, CommandRunner, run_command
from malleable_protocol.safe_io import ensure_private_dir, write_atomic

from slurm_plugin.node.cgroup_actuator import ActuatorError
from malleable_policy.model import Outcome, OutcomeStatus

from slurm_plugin.node.executor import PlanExecutor
from malleable_policy.model import JobView, NodeSnapshot, Plan, PlanInvariantError, Policy
from malleable_policy.decide import decide
from malleable_policy.request import PREFIX, MalleableSpec, RequestError, parse_submit

LABEL = "malleable"
log = logging.getLogger(__name__)


class ContainerParseError(ValueError):
    pass


class ContainerStatus(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    PAUSED = "paused"
    RESTARTING = "restarting"
    REMOVING = "removing"
    EXITED = "exited"
    DEAD = "dead"

    @property
    def holds_cores(self) -> bool:
        """Admitted and not gone: its allocation stays its own."""
        return self in (ContainerStatus.CREATED, ContainerStatus.RUNNING, ContainerStatus.PAUSED,
                        ContainerStatus.RESTARTING)


@dataclass(frozen=True)
class Container:
    id: str
    name: str
    status: ContainerStatus
    created: str                      # docker's RFC 3339 timestamp: admission order
    cpuset: frozenset[int]            # HostConfig.CpusetCpus; empty: every CPU of the host
    spec: MalleableSpec | None        # None: the label does not parse (never admitted)
    label_error: str = ""

    @property
    def job_id(self) -> int:
        """The id the policy and the executor know it by (32 bits of the container id)."""
        return int(self.id[:8], 16)


def parse_inspect(text: str) -> list[Container]:
    """Containers from ``docker inspect`` of labelled containers (a JSON array)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ContainerParseError(f"docker inspect did not print JSON: {exc}") from exc
    if not isinstance(data, list):
        raise ContainerParseError("docker inspect printed JSON that is not a list")
    out = []
    for c in data:
        try:
            cid = str(c["Id"])
            if len(cid) < 12 or not all(ch in "0123456789abcdef" for ch in cid):
                raise ContainerParseError(f"unexpected container id {cid!r}")
            label = str(((c.get("Config") or {}).get("Labels") or {}).get(LABEL, ""))
            spec, error = None, ""
            try:
                spec = parse_submit(PREFIX + label)
            except RequestError as exc:
                error = str(exc)
            out.append(Container(
                id=cid, name=str(c.get("Name", "")).lstrip("/"),
                status=ContainerStatus(str(c["State"]["Status"])),
                created=str(c.get("Created", "")),
                cpuset=parse_cpu_list(str((c.get("HostConfig") or {}).get("CpusetCpus") or "")),
                spec=spec, label_error=error))
        except (KeyError, TypeError, ValueError) as exc:
            raise ContainerParseError(f"unexpected container record: {exc}") from exc
    return out


def admit(allocations: Mapping[str, frozenset[int]], containers: Sequence[Container],
          cpus: frozenset[int]) -> dict[str, frozenset[int]]:
    """The allocations after this look: those of containers that still hold cores are kept,
    the others dropped; each live container not yet admitted, oldest first, gets the lowest
    ``min`` cores no allocation holds, if there are that many (else it waits). One created
    through the agent (``docker create``) starts on those cores; one started by hand ran on
    every core until this look, and is narrowed by this cycle's plan."""
    live = {c.id: c for c in containers if c.status.holds_cores and c.spec is not None}
    out = {cid: cores for cid, cores in allocations.items() if cid in live}
    for c in sorted(live.values(), key=lambda c: (c.created, c.id)):
        if c.id in out:
            continue
        free = sorted(cpus - frozenset().union(*out.values()))
        want = min(c.spec.min_cpus, len(cpus))
        if len(free) >= want:
            out[c.id] = frozenset(free[:want])
    return out


def node_snapshot(node: str, cpus: frozenset[int], containers: Sequence[Container],
                  allocations: Mapping[str, frozenset[int]]) -> NodeSnapshot:
    """What the policy sees: each admitted container as a job whose allocation is its admitted
    cores; one not started yet holds nothing and is not resizable (it starts on its
    allocation, as a Slurm job does)."""
    jobs = []
    for c in containers:
        if c.id not in allocations:
            continue
        running = c.status is not ContainerStatus.CREATED
        jobs.append(JobView(
            job_id=c.job_id, uid=0, user=c.name, allocation=allocations[c.id],
            current=(c.cpuset or cpus) if running else frozenset(), spec=c.spec,
            has_folder=running))
    return NodeSnapshot(node=node, cpus=cpus, jobs=tuple(jobs))


class DockerCli:
    """Every docker command the container co-scheduler runs."""

    def __init__(self, runner: CommandRunner = run_command, *, timeout_s: float = 30.0):
        self._run = runner
        self._timeout = timeout_s

    def containers(self) -> list[Container]:
        ids = self._run(["docker", "ps", "-a", "-q", "--no-trunc", "--filter", f"label={LABEL}"],
                        timeout=self._timeout).stdout.split()
        if not ids:
            return []
        return parse_inspect(self._run(["docker", "inspect", *ids], timeout=self._timeout).stdout)

    def set_cpus(self, container_id: str, cpus: frozenset[int]) -> None:
        self._run(["docker", "update", "--cpuset-cpus", format_cpu_list(cpus), container_id],
                  timeout=self._timeout)

    def start(self, container_id: str) -> None:
        self._run(["docker", "start", container_id], timeout=self._timeout)


class ContainerActuator:
    """The executor's actuator for containers: ``docker update --cpuset-cpus``."""

    def __init__(self, docker: DockerCli, containers: Sequence[Container]):
        self._docker = docker
        self._by_job = {c.job_id: c for c in containers}

    def apply(self, uid: int, job_id: int, cpus: frozenset[int],
              step_cpus: Mapping[str, frozenset[int]] | None = None, *,
              allocation: frozenset[int] | None = None) -> None:
        """A container's cpuset is Docker's to write (no folder a user makes below it)."""
        if not cpus:
            raise ValueError("a container cannot be left without CPUs")
        c = self._by_job.get(job_id)
        if c is None:
            raise ActuatorError(f"no container for job id {job_id}")
        try:
            self._docker.set_cpus(c.id, cpus)
        except CommandError as exc:
            raise ActuatorError(f"container {c.name}: {exc}") from exc


@dataclass
class ContainerCycle:
    containers: list[Container]
    plan: Plan | None
    outcomes: list[Outcome]
    started: list[str]                 # admitted containers started this cycle
    waiting: list[str]                 # containers that do not fit yet
    refused: list[str]                 # containers whose label does not parse


class ContainerCoScheduler:
    """Observe (docker), admit, decide (the agent's policy), act (the agent's executor)."""

    def __init__(self, node: str, cpus: frozenset[int], policy: Policy, state_dir: Path,
                 docker: DockerCli, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.node = node
        self.cpus = cpus
        self.policy = policy
        self.state_dir = Path(state_dir)
        self.docker = docker
        self._clock = clock
        self._sleep = sleep

    @property
    def _allocations_file(self) -> Path:
        return self.state_dir / "container-allocations.json"

    def _load(self) -> dict[str, frozenset[int]]:
        try:
            raw = json.loads(self._allocations_file.read_text())
            return {str(k): parse_cpu_list(str(v)) for k, v in raw.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            # Fail closed: without the record, every live container keeps what it holds.
            raise RuntimeError(f"{self._allocations_file} unreadable: {exc}") from exc

    def _save(self, allocations: Mapping[str, frozenset[int]]) -> None:
        folder = ensure_private_dir(self.state_dir)
        body = json.dumps({k: format_cpu_list(v) for k, v in sorted(allocations.items())})
        write_atomic(folder, self._allocations_file.name, body.encode())

    def cycle(self) -> ContainerCycle:
        found = self.docker.containers()
        refused, usable, seen = [], [], {}
        for c in found:
            if c.spec is None:
                refused.append(c.name)
                log.warning("container %s: label %s refused: %s", c.name, LABEL, c.label_error)
            elif seen.setdefault(c.job_id, c.id) == c.id:   # one 32-bit id twice: the later loses
                usable.append(c)
        allocations = admit(self._load(), usable, self.cpus)
        self._save(allocations)
        waiting = [c.name for c in usable
                   if c.status.holds_cores and c.id not in allocations]
        for name in waiting:
            log.info("container %s waits: fewer free cores than its min", name)
        snapshot = node_snapshot(self.node, self.cpus, usable, allocations)
        if not snapshot.jobs:
            return ContainerCycle(found, None, [], [], waiting, refused)
        plan = decide(snapshot, self.policy)
        executor = PlanExecutor(self.node, RunLayout(self.state_dir / "run"),
                                ContainerActuator(self.docker, usable),
                                clock=self._clock, sleep=self._sleep)
        outcomes = executor.execute(plan, snapshot)
        for o in outcomes:
            log.info("container job %s: %s %s -> %s (%s) %s", o.action.job_id, o.action.kind.value,
                     format_cpu_list(o.action.before), format_cpu_list(o.action.after),
                     o.status.value, o.error)
        started = self._start_admitted(usable, snapshot, outcomes)
        return ContainerCycle(found, plan, outcomes, started, waiting, refused)

    def _start_admitted(self, containers: Sequence[Container], snapshot: NodeSnapshot,
                        outcomes: Sequence[Outcome]) -> list[str]:
        """The Prolog's part: start each admitted container once no other container holds a
        core of its allocation (the shrinks that free them applied; else it waits a cycle)."""
        held = {j.job_id: j.current for j in snapshot.jobs}
        for o in outcomes:
            if o.status is OutcomeStatus.APPLIED:
                held[o.action.job_id] = o.action.after
        started = []
        for c in containers:
            if c.status is not ContainerStatus.CREATED or c.job_id not in held:
                continue
            mine = snapshot.job(c.job_id).allocation
            others = frozenset().union(*(v for k, v in held.items() if k != c.job_id))
            if mine & others:
                continue
            try:
                self.docker.set_cpus(c.id, mine)
                self.docker.start(c.id)
            except CommandError as exc:
                log.error("container %s did not start: %s", c.name, exc)
                continue
            held[c.job_id] = mine
            started.append(c.name)
            log.info("container %s started on %s", c.name, format_cpu_list(mine))
        return started

    def run(self, stop: Callable[[], bool], interval_s: float = 0.5) -> None:
        while not stop():
            try:
                self.cycle()
            except (CommandError, ContainerParseError, RuntimeError, PlanInvariantError) as exc:
                # Nothing of a failed cycle was applied (a plan that breaks a rule never is).
                log.error("container cycle failed: %s", exc)
            self._sleep(interval_s)
