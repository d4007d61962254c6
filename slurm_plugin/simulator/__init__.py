"""``malleable simulate``: the co-scheduler's policies at cluster scale, in a discrete-event
simulation that calls the agent's own ``decide`` (engine.py) on generated workloads or on
Standard Workload Format logs (swf.py, workload.py)."""
from .engine import Backfill, QueueOrder, SimPolicy, SimResult, Simulation, simulate
from .swf import SWFError, SWFHeader, SWFLog, SWFRecord, parse_swf_text, read_swf
from .workload import (Adjustment, Amdahl, DropReason, Measured, SimJob, Workload, WorkloadModel,
                       ask_share, closed_batch, fluid_lower_bound, generate, swf_workload)

__all__ = ["Backfill", "QueueOrder", "SimPolicy", "SimResult", "Simulation", "simulate", "SWFError",
           "SWFHeader", "SWFLog", "SWFRecord", "parse_swf_text", "read_swf", "Adjustment",
           "Amdahl", "DropReason", "Measured", "SimJob", "Workload", "WorkloadModel", "ask_share",
           "closed_batch", "fluid_lower_bound", "generate", "swf_workload"]
