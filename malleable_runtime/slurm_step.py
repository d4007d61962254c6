"""A Slurm step's tasks as the workers of a distributed training job: which node and port each
rank has, from the step's environment (SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE,
SLURM_PROCID). Each framework builds its own cluster description from it (TensorFlow's TF_CONFIG
in ``malleable_tf.multiworker``, PyTorch's MASTER_ADDR and MASTER_PORT in
``malleable_torch.distributed``).

Tasks placed block-wise (Slurm's default) are worker 0, 1, ... in node order, as TensorFlow's
own SlurmClusterResolver assumes; a worker placed otherwise is refused. A node name that does
not resolve (a mini-cluster's) is reached at its NodeAddr (``scontrol show node``). Worker
``rank`` listens on port ``base + rank``, ``base`` from MALLEABLE_TF_WORKER_PORT or from the job
and step ids (two steps on one host rarely collide; set it when they do).
"""
from __future__ import annotations

import re
import socket
import subprocess
from dataclasses import dataclass
from typing import Callable, Mapping

from malleable_protocol.hostlist import expand_counts, expand_hostlist

from .runtime import MalleableError

# Where the derived port bases fall: below Linux's ephemeral ports (net.ipv4.ip_local_port_range,
# 32768-60999 by default), where any outgoing connection may hold a port for a while (a base of
# 38624 once could not be bound: docs/FACTS.md), leaving room for 768 tasks above the base.
PORT_RANGE = (20000, 32000)
_DIGITS = re.compile(r"^[0-9]{1,10}$")


class WorkerPlacementError(MalleableError):
    """The step's tasks are not where a multi-worker cluster can be built from."""


@dataclass(frozen=True)
class Worker:
    rank: int
    node: str
    address: str
    port: int

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"


@dataclass(frozen=True)
class SlurmWorkers:
    """The step's workers, in rank order, and this process's place among them."""

    workers: tuple[Worker, ...]
    rank: int
    local_rank: int
    local_size: int



def _number(environ: Mapping[str, str], *names: str) -> int:
    for name in names:
        value = environ.get(name, "")
        if value:
            if not _DIGITS.fullmatch(value):
                raise WorkerPlacementError(f"{name} must be a number, not {value!r:.32}")
            return int(value)
    raise WorkerPlacementError(f"{' or '.join(names)} is not set: run each worker as a Slurm "
                               "task (srun), one per node or several")


def port_base(environ: Mapping[str, str]) -> int:
    """MALLEABLE_TF_WORKER_PORT, else a base derived from the job and step ids."""
    given = environ.get("MALLEABLE_TF_WORKER_PORT", "")
    if given:
        if not _DIGITS.fullmatch(given) or not 1024 <= int(given) <= 65000:
            raise WorkerPlacementError("MALLEABLE_TF_WORKER_PORT must be a port in 1024..65000, "
                                       f"not {given!r:.32}")
        return int(given)
    job = _number(environ, "SLURM_JOB_ID")
    step = int(environ["SLURM_STEP_ID"]) if _DIGITS.fullmatch(environ.get("SLURM_STEP_ID", "")) \
        else 0
    lo, hi = PORT_RANGE
    return lo + ((job * 64 + step) * 97) % (hi - lo)


def slurm_workers(environ: Mapping[str, str], resolve: Callable[[str], str]) -> SlurmWorkers:
    """The step's workers from Slurm's environment (pure but for ``resolve``, node -> address).
    Raises ``WorkerPlacementError`` when the tasks are not placed block-wise or a variable is
    missing or malformed."""
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    try:
        nodes = expand_hostlist(nodelist)
        counts = expand_counts(per_node or "")
    except ValueError as exc:
        raise WorkerPlacementError(f"cannot read the step's nodes and tasks: {exc}") from None
    if not nodes or len(nodes) != len(counts):
        raise WorkerPlacementError(f"the step's nodes ({nodelist!r:.64}) and tasks per node "
                                   f"({per_node!r:.64}) do not match: run under srun")
    rank = _number(environ, "SLURM_PROCID")
    total = sum(counts)
    tasks = _number(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if tasks != total or rank >= total:
        raise WorkerPlacementError(f"{tasks} tasks in the step, {total} in its tasks per node, "
                                   f"rank {rank}")
    base = port_base(environ)
    if base + total > 65535:
        raise WorkerPlacementError(f"ports {base}..{base + total - 1} do not fit")
    workers, first = [], 0
    for node, count in zip(nodes, counts):
        address = resolve(node)
        workers += [Worker(first + i, node, address, base + first + i) for i in range(count)]
        first += count
    me = workers[rank]
    here = environ.get("SLURMD_NODENAME", "")
    local = _number(environ, "SLURM_LOCALID")
    if (here and here != me.node) or local != rank - sum(counts[:nodes.index(me.node)]):
        raise WorkerPlacementError(
            f"task {rank} runs on {here or '?'} as local task {local}, but tasks placed "
            f"block-wise (Slurm's default) put it on {me.node}: run without --distribution "
            "cyclic/arbitrary, or give TF_CONFIG yourself")
    return SlurmWorkers(tuple(workers), rank, local, counts[nodes.index(me.node)])


def node_address(node: str, *, run: Callable[..., subprocess.CompletedProcess] = subprocess.run
                 ) -> str:
    """The node's IPv4 address: its name resolved, else its NodeAddr from slurmctld."""
    try:
        return socket.getaddrinfo(node, None, socket.AF_INET)[0][4][0]
    except (OSError, UnicodeError):
        pass
    try:
        out = run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True,
                  timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise WorkerPlacementError(f"node {node!r} does not resolve and scontrol could not "
                                   f"name its address: {exc}") from None
    m = re.search(r"(?:^|\s)NodeAddr=(\S+)", out)
    if not m:
        raise WorkerPlacementError(f"node {node!r} does not resolve and has no NodeAddr")
    try:
        return socket.getaddrinfo(m[1], None, socket.AF_INET)[0][4][0]
    except (OSError, UnicodeError):
        raise WorkerPlacementError(f"node {node!r}: its NodeAddr {m[1]!r} does not resolve"
                                   ) from None
