"""What the hooks check in the real cgroup tree before a job or a step starts, against the
allocations the node's ledger knows: the Prolog's ``lent_cores`` and the step start's
``step_start_problems`` (an empty list: safe to start); and ``start_step``, the step start
itself, run by the Python hook and by the agent for the SPANK plugin alike."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from malleable_protocol import check_job_id
from malleable_protocol.errors import printable
from malleable_protocol.layout import check_step_name

from slurm_plugin.node.cgroup_actuator import CgroupJob, CpusetActuator
from slurm_plugin.node.config import AgentConfig
from slurm_plugin.node.ledger import Fence, Ledger, LedgerFile
from slurm_plugin.node.wiring import make_actuator
from slurm_plugin.node.procs import process_uid
from slurm_plugin.node.events import append_event
from slurm_plugin.node.reconciler import CycleResult, Reconciler


@dataclass(frozen=True)
class Verdict:
    """A hook's answer: ``problems`` (the cycle could not run, or the real cgroup tree shows a
    core the starting job or step may get that another job could hold) refuse the start;
    ``reported`` (another job's action failed) do not."""

    problems: list[str] = field(default_factory=list)
    reported: list[str] = field(default_factory=list)
    resizes: int = 0
    ms: float = 0.0

    @property
    def safe(self) -> bool:
        return not self.problems


def note(config: AgentConfig, text: str) -> None:
    """A line in the node's hooks log (root's, capped like the agent's event log)."""
    try:
        config.state_dir.mkdir(parents=True, exist_ok=True)
        append_event(config.state_dir / f"hooks-{config.node}.log",
                     f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {printable(text, 4096)}")
    except OSError:
        pass


def report_verdict(config: AgentConfig, what: str, verdict: Verdict, *, by: str = "hook") -> int:
    """A hook's exit code: 1 (fail closed) when ``verdict`` has problems, else 0. Every
    problem goes to the hooks log and to stderr (slurmd's log); what is only reported, to the
    hooks log."""
    if verdict.reported:
        note(config, f"{what}: reported, not refused: {'; '.join(verdict.reported)}")
    if verdict.problems:
        msg = f"{what}: NOT SAFE to start ({verdict.ms:.0f} ms): {'; '.join(verdict.problems)}"
        note(config, msg)
        print(f"malleable {msg}", file=sys.stderr)
        return 1
    note(config, f"{what}: {verdict.resizes} resizes in {verdict.ms:.0f} ms ({by})")
    return 0


def judge(result: CycleResult, problems: list[str], t0: float) -> Verdict:
    return Verdict(problems=result.errors + problems, reported=result.action_failures,
                   resizes=len(result.applied), ms=(time.monotonic() - t0) * 1000)


def check_step_start(job_id: int, step: str, stepd_pid: int) -> Fence:
    """The fence of a step start whose ids are valid and whose slurmstepd is root's (every one
    of its uids); else ValueError."""
    check_job_id(job_id)
    fence = Fence(step=check_step_name(step), stepd_pid=stepd_pid, since=time.time())
    if stepd_pid <= 1 or process_uid(stepd_pid) != 0:
        raise ValueError(f"pid {stepd_pid} is not a slurmstepd of root")
    return fence


def start_steps(config: AgentConfig, rec: Reconciler, starts: Sequence[tuple[int, Fence]],
                *, cycle: Callable[..., CycleResult] | None = None) -> list[Verdict]:
    """Steps are starting (job, ``fence`` from ``check_step_start``: each step's slurmstepd,
    root's, is about to write its job's folder back to Slurm's allocation): one cycle brings
    every such job back to exactly that allocation (its ranks told first, like any shrink) and
    fences it there until the step has joined its cpuset; then the real tree is checked for
    each. One cycle for all that asked meanwhile: a burst of sruns costs one cycle, not one
    each, and delays no other job's step. ``cycle``: how to run the cycle (the hook's kills a
    hung agent; the agent's is its own)."""
    t0 = time.monotonic()
    result = (cycle or rec.cycle)(fences=tuple(starts))
    return [judge(result, step_start_problems(config, job_id, rec.observer.actuator), t0)
            for job_id, _ in starts]


def start_step(config: AgentConfig, rec: Reconciler, job_id: int, fence: Fence,
               *, cycle: Callable[..., CycleResult] | None = None) -> Verdict:
    """``start_steps`` for one step (the Python hook's: one step start per process)."""
    return start_steps(config, rec, [(job_id, fence)], cycle=cycle)[0]


def _tree(config: AgentConfig, actuator: CpusetActuator | None
          ) -> tuple[dict[int, CgroupJob], dict[str, frozenset[int]], Ledger]:
    """The real cgroup tree (job folders, and those named by a SLUID no slurmstepd tells yet:
    ``CpusetActuator.unidentified``) and the ledger's allocations, each read once per check."""
    act = actuator or make_actuator(config)
    return act.scan(), act.unidentified, LedgerFile(config.state_dir, config.node).load()


def lent_cores(config: AgentConfig, actuator: CpusetActuator | None = None) -> list[str]:
    """Read from the real cgroup tree: jobs holding cores outside their allocation (as the
    ledger knows it), and cores held by two jobs. Empty when the node is safe to start on."""
    found, unidentified, ledger = _tree(config, actuator)
    problems: list[str] = []
    owner: dict[int, str] = {}

    def claim(who: str, cpus: frozenset[int]) -> None:
        for c in sorted(cpus):
            if c in owner:
                problems.append(f"core {c} in {owner[c]} and {who}")
            owner[c] = who

    for job_id, cg in sorted(found.items()):
        if job_id in ledger.ended:
            continue      # its Epilog ran: a folder it left (a user's cpusets in it) runs nothing
        alloc = ledger.allocations.get(job_id)
        if alloc is not None and not cg.cpus <= alloc.cpus:
            problems.append(f"job {job_id} holds {sorted(cg.cpus - alloc.cpus)} outside its "
                            "allocation")
        claim(f"job {job_id}", cg.cpus)
    for name, cpus in sorted(unidentified.items()):
        claim(f"folder {name}", cpus)
    return problems


def jobs_off_their_allocation(config: AgentConfig,
                              actuator: CpusetActuator | None = None) -> list[str]:
    """Read from the real cgroup tree: running jobs whose folder holds other cores than their
    allocation (as the ledger knows it). Empty when every job holds exactly Slurm's cores."""
    found, _, ledger = _tree(config, actuator)
    return [f"job {job_id} holds {sorted(cg.cpus)}, not its {sorted(alloc.cpus)}"
            for job_id, cg in sorted(found.items())
            if job_id not in ledger.ended and (alloc := ledger.allocations.get(job_id))
            is not None and cg.cpus != alloc.cpus]


def step_start_problems(config: AgentConfig, job_id: int,
                        actuator: CpusetActuator | None = None) -> list[str]:
    """Read from the real cgroup tree: what of ``job_id``'s folders lies outside its allocation
    (as the ledger knows it), and cores of that allocation another running job's folder holds
    (a shrink of a borrower that failed). Empty when slurmstepd can write the allocation to the
    job folder without sharing a core."""
    found, unidentified, ledger = _tree(config, actuator)
    cg = found.get(job_id)
    alloc = ledger.allocations.get(job_id)
    if alloc is None:      # no folder yet (the batch step): slurmstepd makes it
        return [] if cg is None else [f"job {job_id}: allocation unknown on this node"]
    mine = [] if cg is None else [
        f"job {job_id} {rel or 'folder'} holds {sorted(cpus - alloc.cpus)} outside its "
        "allocation" for rel, cpus in [("", cg.cpus), *cg.folders.items()]
        if not cpus <= alloc.cpus]
    return mine + [f"job {other} holds {sorted(c.cpus & alloc.cpus)} of job {job_id}'s "
                   "allocation" for other, c in sorted(found.items())
                   if other != job_id and other not in ledger.ended and c.cpus & alloc.cpus] \
        + [f"folder {name} (no slurmstepd says whose) holds {sorted(cpus & alloc.cpus)} of job "
           f"{job_id}'s allocation" for name, cpus in sorted(unidentified.items())
           if cpus & alloc.cpus]
