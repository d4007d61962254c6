"""``malleable simulate``: the co-scheduler's policies at cluster scale, in a discrete-event
simulation that calls the agent's own ``decide`` (engine.py) on generated or SWF workloads
(workload.py)."""
from .engine import QueueOrder, SimPolicy, SimResult, Simulation, simulate
from .workload import (Amdahl, Measured, SimJob, WorkloadModel, ask_share, fluid_lower_bound,
                       generate, parse_swf)

__all__ = ["QueueOrder", "SimPolicy", "SimResult", "Simulation", "simulate", "Amdahl", "Measured", "SimJob",
           "WorkloadModel", "ask_share", "fluid_lower_bound", "generate", "parse_swf"]
