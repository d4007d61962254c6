"""``malleable simulate``: the co-scheduler's policies at cluster scale, in a discrete-event
simulation that calls the agent's own ``decide`` (engine.py) on generated workloads or on
Standard Workload Format logs (swf.py, workload.py, lublin.py).

A research tool, a package of its own beside the node side: it depends on the policy code
(``slurm_plugin.coscheduler``), and the node package (packaging/deb) leaves it out."""
from .engine import (BF_WINDOW_S, Backfill, NodeBounds, Placement, QueueOrder, SimPolicy, SimResult,
                     Simulation, simulate)
from .lublin import Downey, LublinModel, generate_lublin, offered_load, scale_to_load
from .swf import SWFError, SWFHeader, SWFLog, SWFRecord, parse_swf_text, read_swf
from .workload import (Adjustment, Amdahl, DropReason, Measured, SimJob, Workload, WorkloadModel,
                       ask_share, closed_batch, fluid_lower_bound, generate, swf_workload)

__all__ = ["BF_WINDOW_S", "Backfill", "NodeBounds", "Placement", "QueueOrder", "SimPolicy", "SimResult",
           "Simulation", "simulate", "Downey", "LublinModel", "generate_lublin", "offered_load",
           "scale_to_load", "SWFError", "SWFHeader", "SWFLog", "SWFRecord", "parse_swf_text",
           "read_swf", "Adjustment", "Amdahl", "DropReason", "Measured", "SimJob", "Workload",
           "WorkloadModel", "ask_share", "closed_batch", "fluid_lower_bound", "generate",
           "swf_workload"]
