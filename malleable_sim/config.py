"""What a simulation is asked to model: the regime (``SimPolicy``), Slurm's settings as the
stand-in has them (``QueueOrder``, ``Backfill`` with ``BF_WINDOW_S``, ``Placement``), and the
node-count regime's bounds (``NodeBounds``)."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Sequence

from malleable_policy.model import Policy

from .workload import SimJob, ask_share, moldable


class SimPolicy(enum.Enum):
    """The regimes, in the order they are reported: the baselines first."""

    STATIC = "static"
    STATIC_ASK = "static-ask"
    MOLDABLE = "moldable"
    CGROUP_ONLY = "cgroup-only"
    LEND_IDLE = "lend-idle"
    THROUGHPUT = "throughput"
    NODES = "nodes"

    @property
    def threads_follow(self) -> bool:
        """Whether a job's threads grow with its cores."""
        return self in (SimPolicy.LEND_IDLE, SimPolicy.THROUGHPUT)

    @property
    def asks_less(self) -> bool:
        """Whether malleable jobs ask Slurm for ``malleable_ask`` of their size."""
        return self.threads_follow or self is SimPolicy.STATIC_ASK

    def submitted(self, jobs: Sequence[SimJob], malleable_ask: float,
                  node_cores: int) -> list[SimJob]:
        """The jobs as this regime's users submit them: each malleable job asking Slurm for
        ``malleable_ask`` of its cores (``ask_share``) where the regime asks less; under moldable
        each asking for the size an oracle of its speedup curve picks (``moldable``); under
        static and cgroup-only every job asks for its size, as plain TensorFlow users do."""
        if self is SimPolicy.MOLDABLE:
            return moldable(jobs, node_cores)
        return ask_share(jobs, malleable_ask, node_cores) if self.asks_less else list(jobs)

    @property
    def same_asks_baseline(self) -> "SimPolicy | None":
        """The regime without an agent whose jobs ask Slurm for the same: against it, what
        this regime's agent does on its own shows (None: no agent runs). Node-count
        malleability's own effect is against static: its jobs ask for their size."""
        if self is SimPolicy.NODES:
            return SimPolicy.STATIC
        if self.agent_policy is None:
            return None
        return SimPolicy.STATIC_ASK if self.asks_less else SimPolicy.STATIC

    @property
    def agent_policy(self) -> Policy | None:
        return {SimPolicy.STATIC: None, SimPolicy.STATIC_ASK: None, SimPolicy.MOLDABLE: None,
                SimPolicy.CGROUP_ONLY: Policy.LEND_IDLE, SimPolicy.LEND_IDLE: Policy.LEND_IDLE,
                SimPolicy.THROUGHPUT: Policy.THROUGHPUT, SimPolicy.NODES: None}[self]


class TimeLimits(enum.Enum):
    """What a job's time limit does (``--time-limits``)."""

    # As Slurm: a job still running at its start + time limit ends then (TIMEOUT), its work
    # unfinished. A shrunk job can meet it: the regimes that shrink pay for it.
    ENFORCED = "enforced"
    # The second round's simulator: every job runs until its work is done (kept so that round 2's
    # results reproduce).
    IGNORED = "ignored"


@dataclass(frozen=True)
class ResizeCosts:
    """What a resize costs the job, as a pause with its cores held and no work done: ``node_s``
    for a node given or taken back (``--node-resize-cost``: a restart from a checkpoint, a
    Horovod Elastic resync: reported at 0, 10, 60 and 300 s), ``core_s`` for a change of cores
    within a node (``--core-move-cost``: the cgroup write and the threads' resize, which the
    project's benchmarks measure in milliseconds)."""

    node_s: float = 0.0
    core_s: float = 0.0

    def __post_init__(self) -> None:
        if self.node_s < 0 or self.core_s < 0:
            raise ValueError("a resize cost is a time: 0 or more seconds")


@dataclass(frozen=True)
class NodeBounds:
    """How far the ``nodes`` regime moves a malleable job's node count: down to ``shrink_to``
    of the nodes it asked for (rounded up, at least 1), up to ``grow_to`` times them, and a
    whole node more only if its cores add at least ``min_gain`` of what each of the job's cores
    does now (its speedup curve: Downey's is flat beyond 2A - 1, so such a job never grows),
    and not within ``regrow_after_s`` of giving one back."""

    shrink_to: float = 0.5
    grow_to: float = 2.0
    min_gain: float = 0.5
    # Hysteresis: a job that gave a node back is not given one again for this long (0: at the
    # next idle node, as the second round had it), so that nodes do not go back and forth.
    regrow_after_s: float = 0.0

    def fewest(self, asked_nodes: int) -> int:
        return max(1, math.ceil(asked_nodes * self.shrink_to))

    def most(self, asked_nodes: int) -> int:
        return max(asked_nodes, int(asked_nodes * self.grow_to))


class QueueOrder(enum.Enum):
    """The order of Slurm's queue (its priority), the same in every regime.

    fcfs           submission order: Slurm's default (priority/basic, or multifactor's age)
    widest-first   the most cores first: multifactor's job-size factor with large jobs favoured
                   (PriorityFavorSmall=NO), a common site setting
    longest-first  the longest time limit first (start + start-up + runtime at the allocation):
                   what a site could set from the time limit; longest-processing-time-first
                   is the classic order for a short makespan
    """

    FCFS = "fcfs"
    WIDEST_FIRST = "widest-first"
    LONGEST_FIRST = "longest-first"

    def key(self, job: SimJob) -> tuple:
        """Smaller is served first; submission order breaks ties."""
        tie = (job.submit_s, job.job_id)
        if self is QueueOrder.WIDEST_FIRST:
            return (-job.cores, *tie)
        if self is QueueOrder.LONGEST_FIRST:
            return (-job.expected_s, *tie)
        return tie


# Slurm's bf_window default (BACKFILL_WINDOW in sched/backfill: 24 h).
BF_WINDOW_S = 24 * 3600.0


class Backfill(enum.Enum):
    """Slurm's backfill pass (sched/backfill, every bf_interval), in two variants.

    conservative  Slurm's: the queued jobs are tested in queue order, up to bf_max_job_test;
                  each starts now if it fits without delaying a job tested before it, else it
                  is reserved at the earliest time it fits, and no job tested after it may
                  delay that. Like Slurm's node space map, a reservation holds its job's nodes
                  whole, for its time limit. A job that cannot start within bf_window (one day
                  by default) of the pass gets no reservation, as in Slurm ("starts too far in
                  the future to worry about"): jobs after it may take its place.
    easy          only the first job that does not fit is reserved (EASY backfill); the jobs
                  after it start where they cannot delay it, on the cores it leaves.
    """

    CONSERVATIVE = "conservative"
    EASY = "easy"


@dataclass(frozen=True)
class SlurmPass:
    """Slurm 22.05's backfill pass itself in place of the conservative stand-in, for the replays
    of small clusters it is checked against (``engine._slurm_conservative``; its loops over the
    reservations are too slow for traces of thousands of nodes). What it has that the stand-in
    lacks, from Slurm's source (tag slurm-22-05-8-1):
    - select/cons_tres's _will_run_test (cons_common/job_test.c) frees the running jobs in end
      order in groups: the first ends at slurmctld's next 30 s barrier after the first end plus
      30 s, the window doubling for each later group, and a job that fits after a group is
      expected to start at the end of the group's LAST job, not at the first moment it fits;
    - a job wider than a node goes on consecutive nodes in node order (cons_tres's
      _eval_nodes, ``slurm_standin.eval_nodes``);
    - times in slurmctld's whole seconds; a running job ends at its whole-second start plus
      its limit.
    Rigid jobs only (policy static). ``clock_s``: slurmctld's clock at simulated time 0,
    modulo 30 s (where its whole seconds and its barriers fall; a replay's log tells it, a
    prediction does not)."""

    clock_s: float = 0.0


class Placement(enum.Enum):
    """Where a job that fits a node goes when no single node holds it now.

    one-node      it waits for one node that holds it (best fit): the stand-in's earlier
                  rule, and ``-N 1`` (or ``--ntasks-per-node=P``) in Slurm
    slurm-tasks   the default: what select/cons_tres (CR_Core) does with ``sbatch -n P``: one
                  node if one holds it (best fit), else its tasks spread over several nodes as
                  a job wider than a node is (``select_nodes``: the node with the most free
                  cores first, each giving all it has); it then runs as a multi-node job (a
                  rank per core). Replayed on real Slurm (benchmarks/cluster/slurm_replay.py) its start
                  times are nearer Slurm's than one-node's (median error 0.17 vs 0.45).
    Jobs wider than a node are placed alike under both.
    """

    ONE_NODE = "one-node"
    SLURM_TASKS = "slurm-tasks"
