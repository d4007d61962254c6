"""``malleable-sim``: the co-scheduler's policies at cluster scale, in a discrete-event
simulation that calls the agent's own ``decide`` (engine.py) on generated workloads or on
Standard Workload Format logs (swf.py, workload.py, lublin.py); commands/main.py is the command.

A research tool, a package of its own beside the node side: it depends on the pure policy
(``malleable_policy``), the node side never imports it, and the node package (packaging/deb)
leaves it out.

The names below are loaded from their modules on first use (PEP 562), so that ``malleable-sim``
can say in one line that numpy (the ``sim`` extra, which the engine needs) is missing."""
from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "config": ["BF_WINDOW_S", "Backfill", "NodeBounds", "Placement", "QueueOrder", "ResizeCosts",
               "SimPolicy", "SlurmPass", "TimeLimits"],
    "engine": ["Simulation", "simulate"],
    "results": ["JobResult", "SimResult"],
    "lublin": ["LublinModel", "generate_lublin", "offered_load", "scale_to_load"],
    "swf": ["SWFError", "SWFHeader", "SWFLog", "SWFRecord", "parse_swf_text", "read_swf"],
    "workload": ["Adjustment", "Amdahl", "Downey", "DropReason", "Measured", "MissingLimit",
                 "SimJob", "SpeedupModel", "Workload", "WorkloadModel", "ask_share",
                 "closed_batch", "efficiency_at_request", "fluid_lower_bound", "generate",
                 "swf_workload"],
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_HOME_OF)


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
