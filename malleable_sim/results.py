"""What a simulation gives: each job's times (``JobResult``) and the run's metrics
(``SimResult``)."""
from __future__ import annotations

from dataclasses import dataclass



@dataclass(frozen=True)
class JobResult:
    job_id: int
    submit_s: float
    start_s: float
    end_s: float
    cores: int
    malleable: bool
    nodes: int = 1
    reference_s: float = 0.0   # start-up and runtime at its requested size (``SimJob``)
    timed_out: bool = False    # ended at its time limit, its work unfinished (TimeLimits)

    @property
    def response_s(self) -> float:
        return self.end_s - self.submit_s

    @property
    def counted_response_s(self) -> float:
        """What the job's user waited for its work: a job killed at its time limit lost it and
        runs again, at once, at its requested size (a lower bound on what the kill costs;
        without it a killed job would count as one that finished early)."""
        return self.response_s + (self.reference_s if self.timed_out else 0.0)

    @property
    def wait_s(self) -> float:
        return self.start_s - self.submit_s


@dataclass(frozen=True)
class SimResult:
    policy: str
    nodes: int
    cores: int
    jobs: int
    malleable_jobs: int
    core_seconds: float        # cores the jobs' threads used x seconds (start-up excluded)
    makespan_s: float          # first submit to last end
    lower_bound_makespan_s: float
    mean_response_s: float     # submit to end (turnaround); a killed job's rerun counted
    p95_response_s: float
    mean_wait_s: float         # submit to start
    p95_wait_s: float
    mean_bounded_slowdown: float   # metrics.bounded_slowdown, tau = TAU_S
    utilisation: float         # core_seconds / (cores x makespan)
    queue_order: str
    backfill: str
    resizes: int               # changes of a running job's cores (per node)
    decide_calls: int
    wall_s: float
    per_job: tuple[JobResult, ...] = ()
    # Cores held by jobs that resizes paused x seconds (engine.ResizeCosts), and those costs.
    paused_core_s: float = 0.0
    node_resize_cost_s: float = 0.0
    core_move_cost_s: float = 0.0
    time_limits: str = "ignored"
    timed_out_jobs: int = 0        # ended at their time limit, work unfinished

    @property
    def mean_completion_s(self) -> float:
        """The earlier name of ``mean_response_s`` (benchmarks/cluster/coscheduling/validate.py)."""
        return self.mean_response_s

    def summary(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "per_job"}


# Rounds of offers between a multi-node job's agents settled in one instant: each round
# replans the nodes whose peer cap changed (offers do not depend on peer caps, so the second
# round is normally the last).
