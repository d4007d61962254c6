"""What the hooks check in the real cgroup tree before a job or a step starts, against the
allocations the node's ledger knows: the Prolog's ``lent_cores`` and the step start's
``step_start_problems``. An empty list: safe to start."""
from __future__ import annotations

from .cgroup_actuator import CgroupJob, CpusetActuator
from .config import AgentConfig
from .ledger import Ledger, LedgerFile
from .node import make_actuator


def _tree(config: AgentConfig, actuator: CpusetActuator | None
          ) -> tuple[dict[int, CgroupJob], Ledger]:
    """The real cgroup tree and the ledger's allocations, each read once per check."""
    return ((actuator or make_actuator(config)).scan(),
            LedgerFile(config.state_dir, config.node).load())


def lent_cores(config: AgentConfig, actuator: CpusetActuator | None = None) -> list[str]:
    """Read from the real cgroup tree: jobs holding cores outside their allocation (as the
    ledger knows it), and cores held by two jobs. Empty when the node is safe to start on."""
    found, ledger = _tree(config, actuator)
    problems, owner = [], {}
    for job_id, cg in sorted(found.items()):
        if job_id in ledger.ended:
            continue      # its Epilog ran: a folder it left (a user's cpusets in it) runs nothing
        alloc = ledger.allocations.get(job_id)
        if alloc is not None and not cg.cpus <= alloc.cpus:
            problems.append(f"job {job_id} holds {sorted(cg.cpus - alloc.cpus)} outside its "
                            "allocation")
        for c in cg.cpus:
            if c in owner:
                problems.append(f"core {c} in jobs {owner[c]} and {job_id}")
            owner[c] = job_id
    return problems


def step_start_problems(config: AgentConfig, job_id: int,
                        actuator: CpusetActuator | None = None) -> list[str]:
    """Read from the real cgroup tree: what of ``job_id``'s folders lies outside its allocation
    (as the ledger knows it), and cores of that allocation another running job's folder holds
    (a shrink of a borrower that failed). Empty when slurmstepd can write the allocation to the
    job folder without sharing a core."""
    found, ledger = _tree(config, actuator)
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
                   if other != job_id and other not in ledger.ended and c.cpus & alloc.cpus]
