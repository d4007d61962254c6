"""Batch scripts for malleable jobs (Horovod, Keras 3 multi-worker, PyTorch DDP), as package templates
(string.Template).

Each template declares its parameters and their kinds. A value goes into a ``#SBATCH`` line only
if it matches a strict pattern (sbatch reads those lines itself, without a shell, so nothing can
be quoted there), and into shell lines only shell-quoted. Anything else is refused.
"""
from __future__ import annotations

import re
import shlex
import string
from dataclasses import dataclass
from importlib import resources
from malleable_protocol.errors import FixableError


class TemplateError(FixableError, ValueError):
    pass


# kind -> (pattern a value must match, how it is written into the script)
_DIRECTIVE = {
    "int": re.compile(r"^[1-9][0-9]{0,5}$"),
    "name": re.compile(r"^[A-Za-z0-9_.-]{1,64}$"),
    "time": re.compile(r"^([0-9]{1,4}|[0-9]{1,2}:[0-9]{2}:[0-9]{2}|[0-9]+-[0-9]{1,2}(:[0-9]{2}){0,2})$"),
    "bound": re.compile(r"^([1-9][0-9]{0,3}|node)$"),
    "nodelist": re.compile(r"^[A-Za-z0-9_,\[\]-]{1,256}$"),
    "path": re.compile(r"^[A-Za-z0-9_./%-]{1,1024}$"),
}


@dataclass(frozen=True)
class Param:
    kind: str            # a _DIRECTIVE kind, or "shell" (quoted) or "shell-args" (split, quoted)
    default: str | None  # None: required


TEMPLATES: dict[str, dict[str, Param]] = {
    "single-node": {
        "job_name": Param("name", "malleable"), "ntasks": Param("int", "2"),
        "min_cpus": Param("bound", "1"), "max_cpus": Param("bound", "node"),
        "time": Param("time", "30"), "output": Param("path", "malleable-%j.out"),
        "program": Param("shell", None), "args": Param("shell-args", ""),
        "python": Param("shell", "python3"),
    },
    "multi-node": {
        "job_name": Param("name", "malleable"), "nodes": Param("int", "2"),
        "tasks_per_node": Param("int", "1"), "min_cpus": Param("bound", "1"),
        "max_cpus": Param("bound", "node"), "time": Param("time", "30"),
        "output": Param("path", "malleable-%j.out"), "program": Param("shell", None),
        "args": Param("shell-args", ""), "python": Param("shell", "python3"),
    },
    "coschedule": {
        "job_name": Param("name", "cosched"), "nodelist": Param("nodelist", None),
        "ntasks": Param("int", "1"), "cpus": Param("int", "1"), "min_cpus": Param("bound", "1"),
        "max_cpus": Param("bound", "node"), "weight": Param("int", "1"),
        "time": Param("time", "30"), "output": Param("path", "cosched-%j.out"),
        "program": Param("shell", None), "args": Param("shell-args", ""),
        "python": Param("shell", "python3"),
    },
}


# Keras 3 workers and PyTorch DDP workers take the multi-node job's parameters.
TEMPLATES["multi-worker"] = {**TEMPLATES["multi-node"], "job_name": Param("name", "malleable-mw")}
TEMPLATES["pytorch-ddp"] = {**TEMPLATES["multi-node"], "job_name": Param("name", "malleable-ddp")}

# Every template runs PROGRAM with this interpreter through this launcher.
for _params in TEMPLATES.values():
    _params["launcher"] = Param("shell", "malleable-srun")


def _render_value(name: str, kind: str, value: str) -> str:
    if kind == "shell":
        if "\n" in value or "\0" in value:
            raise TemplateError(f"{name}: line breaks are not allowed")
        return shlex.quote(value)
    if kind == "shell-args":
        if "\n" in value or "\0" in value:
            raise TemplateError(f"{name}: line breaks are not allowed")
        try:
            return " ".join(shlex.quote(a) for a in shlex.split(value))
        except ValueError as exc:
            raise TemplateError(f"{name}: {exc}") from exc
    if not _DIRECTIVE[kind].match(value):
        raise TemplateError(f"{name}={value!r} is not a valid {kind} for an #SBATCH line")
    return value


def render(template: str, values: dict[str, str]) -> str:
    if template not in TEMPLATES:
        raise TemplateError(f"no template {template!r} (have: {', '.join(sorted(TEMPLATES))})")
    params = TEMPLATES[template]
    unknown = set(values) - set(params)
    if unknown:
        raise TemplateError(f"unknown parameters for {template}: {', '.join(sorted(unknown))}")
    out = {}
    for name, p in params.items():
        value = values.get(name, p.default)
        if value is None:
            raise TemplateError(f"{template} needs {name}=...")
        out[name] = _render_value(name, p.kind, str(value))
    if out.get("min_cpus", "1") != "node" and out.get("max_cpus", "node") != "node" and \
            int(out["min_cpus"]) > int(out["max_cpus"]):
        raise TemplateError("min_cpus is above max_cpus")
    text = resources.files(__name__).joinpath(f"{template}.sbatch.tmpl").read_text()
    return string.Template(text).substitute(out)


def parse_sets(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise TemplateError(f"--set wants key=value, not {item!r}")
        out[key] = value
    return out
