"""Dependency hygiene: what the installed packages import from outside the standard library is
exactly what pyproject.toml requires (core) or offers as an extra, or the user's own stack."""
from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The packages that ship: the ones pyproject.toml tells setuptools to find.
PACKAGES = tuple(p.rstrip("*") for p in tomllib.loads((REPO / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"]["find"]["include"])
# The training stack a user brings (never required: requiring one would replace another).
USERS_OWN = {"tensorflow", "keras", "numpy", "horovod", "sklearn", "pyslurm", "torch"}
# Distribution name -> import name, where they differ.
IMPORT_NAME = {"prometheus-client": "prometheus_client", "pyslurm": "pyslurm"}


def third_party_imports() -> dict[str, set[str]]:
    """Import name -> the files importing it (at any depth: lazy imports count)."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in PACKAGES:
                        found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def requirement_names(reqs: list[str]) -> set[str]:
    out = set()
    for r in reqs:
        name = r.split(";")[0]
        for sep in "<>=!~[ ":
            name = name.split(sep)[0]
        out.add(IMPORT_NAME.get(name, name.replace("-", "_")))
    return out


def test_every_import_is_required_offered_or_the_users_own():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = requirement_names(project["dependencies"])
    extras = set().union(*(requirement_names(v)
                           for v in project["optional-dependencies"].values()))
    imports = third_party_imports()
    unknown = {name: sorted(files) for name, files in imports.items()
               if name not in core | extras | USERS_OWN}
    assert not unknown, unknown
    # Every core requirement is imported somewhere (none is listed for nothing).
    assert core <= set(imports), core - set(imports)
    # psutil is the local cluster's alone, imported where it is used.
    assert imports.get("psutil", set()) <= {"slurm_plugin/cluster/local.py"}


def test_no_framework_is_required_and_mpi4py_is_gone():
    text = (REPO / "pyproject.toml").read_text()
    project = tomllib.loads(text)["project"]
    every = project["dependencies"] + sum(project["optional-dependencies"].values(), [])
    # A torch requirement would also make pip fetch a CUDA build of several GB over a user's CPU one.
    assert not [r for r in every if r.startswith(("tensorflow", "keras", "mpi4py", "torch"))], every
