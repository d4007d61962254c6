"""The packages' import edges match how they are deployed: the user runtime (malleable_runtime,
malleable_tf) and the example programs run in the user's job and never import the root daemon's
package; the protocol imports nothing of the project and nothing outside the standard library."""
import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(package: str) -> dict[str, set[str]]:
    out = {}
    for path in (ROOT / package).rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
        out[str(path.relative_to(ROOT))] = names
    return out


def test_job_side_never_imports_the_root_daemon():
    for package in ("malleable_runtime", "malleable_tf", "malleable_torch", "examples",
                    "malleable_protocol"):
        for path, names in imported_modules(package).items():
            bad = sorted(n for n in names if n.split(".")[0] == "slurm_plugin")
            assert not bad, f"{path} imports {bad}"


def test_protocol_depends_on_the_standard_library_only():
    for path, names in imported_modules("malleable_protocol").items():
        foreign = sorted(n for n in names if n.split(".")[0] not in sys.stdlib_module_names
                         and n.split(".")[0] not in ("__future__",))
        assert not foreign, f"{path} imports {foreign}"


def test_the_check_can_fail():
    # The scan sees a real import edge: slurm_plugin does import the protocol.
    edges = imported_modules("slurm_plugin")
    assert any("malleable_protocol" in n for names in edges.values() for n in names)


# --- the project's import graph: layers, and no circle ---------------------------------------

# The packages of the project: the ones pyproject.toml ships (tests and benchmarks are left out).
PACKAGES = tuple(p.rstrip("*") for p in tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"]["find"]["include"])

# Each unit's layer: a unit imports only units of lower layers (and itself). The order the
# architecture promises (docs/design.md, "The house"): protocol < policy < feed, simulator, user
# runtime < the node's cycle < what runs it (daemon, hooks, containers) < the development
# cluster < the operator's command.
LAYERS = {
    "malleable_protocol": 0,
    "slurm_plugin.settings": 0.5,    # the root side's environment, below every adapter reading it
    "malleable_policy": 1,
    # adapters to the outside the feed and the node share: Slurm's commands, the cgroup tree,
    # the SPANK plugin's build, logging, the batch templates
    "slurm_plugin.topology": 0.75,   # the node's CPU numbering and Slurm's (pure but for sysfs)
    "slurm_plugin.slurm": 1, "slurm_plugin.cgroups": 1,
    "slurm_plugin.logs": 1, "sbatch_templates": 1,
    "slurm_plugin.timeline": 1,     # the stacked timeline (pure, and its picture)
    "slurm_plugin.feed": 2, "malleable_sim": 2, "malleable_runtime": 2,
    "slurm_plugin.node": 3, "malleable_tf": 3,      # TensorFlow's adapter to malleable_runtime
    "malleable_torch": 3,                           # PyTorch's
    "examples": 4,                                  # example training programs
    "slurm_plugin.daemon": 4, "slurm_plugin.hooks": 4, "slurm_plugin.containers": 4,
    "slurm_plugin.cluster": 5,
    "slurm_plugin.commands": 6,
    "slurm_plugin.coscheduler": 7,   # an earlier version's hook path, for rendered Prologs
    "slurm_plugin": 7,               # its __init__ (empty)
}


def unit_of(module: str) -> str:
    """The layer unit a module belongs to: slurm_plugin's subpackages, else the package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "slurm_plugin" and len(parts) > 1 else parts[0]


def module_files(root: Path, packages) -> dict[str, Path]:
    out = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(body, call_time: bool):
    """The import statements of a module's body: at its top (under ``if TYPE_CHECKING:`` and
    ``try:`` too: a circle a type checker walks is a circle), and, with ``call_time``, inside
    functions and classes as well (a lazy import papers over a circle, it does not remove it)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif call_time or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                ast.ClassDef)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                yield from _imports(getattr(node, field, []) or [], call_time)


def import_graph(root: Path, packages, *, call_time: bool = True) -> dict[str, set[str]]:
    """Module -> the project's modules it imports. ``from pkg import name`` is an edge to
    ``pkg.name`` where that is a module, else to ``pkg``; an edge to a module's own package
    counts (a submodule that its package imports at its top and that imports the package would
    see it half-made)."""
    modules = module_files(root, packages)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in _imports(ast.parse(path.read_text(), str(path)).body, call_time):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        here = here.rpartition(".")[0]
                    base = f"{here}.{base}" if base else here
                targets = [f"{base}.{a.name}" for a in node.names]
            edges |= {t for t in map(resolve, targets) if t is not None and t != name}
        graph[name] = edges
    return graph


def module_level_imports(package_dir: Path, package: str) -> dict[str, set[str]]:
    """One package's modules and the modules of it each imports when it is imported (not at
    call time)."""
    graph = import_graph(package_dir.parent, [package], call_time=False)
    return {m: {e for e in edges if e.split(".")[0] == package} for m, edges in graph.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}   # 1: on the path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    units: dict[str, set[str]] = {}
    for module, edges in graph.items():
        units.setdefault(unit_of(module), set()).update(
            unit_of(e) for e in edges if unit_of(e) != unit_of(module))
    return units


def layer_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a unit of the same or a higher layer than the importer's own."""
    return sorted(f"{m} imports {e}" for m, edges in graph.items() for e in edges
                  if unit_of(e) != unit_of(m) and LAYERS[unit_of(e)] >= LAYERS[unit_of(m)])


def test_no_import_circle_between_modules_or_packages():
    """Every import counts, at the top, under TYPE_CHECKING or inside a function."""
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 80      # every module of the project was read
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    units = unit_graph(graph)
    assert find_cycle(units) is None, " -> ".join(find_cycle(units))


def test_every_unit_imports_only_lower_layers():
    graph = import_graph(ROOT, PACKAGES)
    assert set(map(unit_of, graph)) == set(LAYERS), "a new unit: give it a layer in LAYERS"
    assert layer_breaches(graph) == []


def test_the_node_side_imports_no_simulator_and_the_policy_only_the_protocol():
    graph = import_graph(ROOT, PACKAGES)
    for module, edges in graph.items():
        if module.startswith("slurm_plugin"):
            assert not [e for e in edges if e.startswith("malleable_sim")], module
        if module.startswith("malleable_policy"):
            assert {unit_of(e) for e in edges} <= {"malleable_protocol", "malleable_policy"}, \
                module
    for path, names in imported_modules("malleable_policy").items():
        outside = sorted(n for n in names if n.split(".")[0] not in sys.stdlib_module_names
                         and n.split(".")[0] not in ("__future__", "malleable_protocol",
                                                     "malleable_policy"))
        assert not outside, f"{path} imports {outside}"
    # The scan sees the policy's real edge, and the simulator's use of it.
    assert "malleable_policy.model" in graph["malleable_policy.decide"]
    assert any(e.startswith("malleable_policy") for e in graph["malleable_sim.engine"])


def test_the_graph_checks_can_fail(tmp_path):
    """The circles this tree had (a lazy import and a TYPE_CHECKING one closing them), and a
    layer breach: each is found."""
    for folder in ("slurm_plugin/node", "slurm_plugin/commands"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "malleable_policy").mkdir()
    files = {
        "slurm_plugin/__init__.py": "",
        "slurm_plugin/node/__init__.py": "",
        "slurm_plugin/commands/__init__.py": "",
        "slurm_plugin/node/ledger.py": "from .accounting import CoreUsage\n",
        "slurm_plugin/node/accounting.py":
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .ledger import L\n",
        "slurm_plugin/commands/main.py": "def simulate():\n    from malleable_policy import decide\n",
        "slurm_plugin/node/reconciler.py": "from malleable_policy.decide import decide\n",
        "malleable_policy/__init__.py": "",
        "malleable_policy/decide.py": "def f():\n    from slurm_plugin.node import ledger\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ["slurm_plugin", "malleable_policy"])
    assert find_cycle(graph) == ["slurm_plugin.node.ledger",
                                 "slurm_plugin.node.accounting",
                                 "slurm_plugin.node.ledger"]
    assert find_cycle(unit_graph(graph)) == ["malleable_policy", "slurm_plugin.node",
                                             "malleable_policy"]
    assert layer_breaches(graph) == [
        "malleable_policy.decide imports slurm_plugin.node.ledger"]
    # Without call-time imports, the lazy edges are gone; the TYPE_CHECKING one stays.
    top = import_graph(tmp_path, ["slurm_plugin", "malleable_policy"], call_time=False)
    assert top["slurm_plugin.commands.main"] == set() and top["malleable_policy.decide"] == set()
    assert top["slurm_plugin.node.reconciler"] == {"malleable_policy.decide"}
    assert top["slurm_plugin.node.accounting"] == {"slurm_plugin.node.ledger"}


# What a framework is: its modules, and the project's adapters to them.
FRAMEWORKS = ("tensorflow", "keras", "horovod", "torch", "jax", "malleable_tf")


def test_the_user_runtime_core_imports_no_framework():
    """malleable_runtime is the part every framework shares: no import of one, at any time (a
    lazy import would make a PyTorch job load TensorFlow)."""
    for path, names in imported_modules("malleable_runtime").items():
        assert not [n for n in names if n.split(".")[0] in FRAMEWORKS], path
    lazy = [n for names in imported_modules("malleable_tf").values() for n in names]
    assert "tensorflow" in lazy and "malleable_runtime.runtime" in lazy   # the scan sees both
    done = subprocess.run([sys.executable, "-c",
                           "import sys, malleable_runtime.session, malleable_runtime.srun; "
                           f"print(sorted(set(sys.modules) & set({FRAMEWORKS!r})))"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_user_runtime_modules_import_each_other_without_a_cycle():
    graph = module_level_imports(ROOT / "malleable_runtime", "malleable_runtime")
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    # ThreadState has a module of its own; both its users import it from there.
    assert "malleable_runtime.state" in graph["malleable_runtime.runtime"]
    assert "malleable_runtime.state" in graph["malleable_runtime.telemetry"]
    assert graph["malleable_runtime.state"] == set()


def test_the_cycle_check_can_fail(tmp_path):
    # The cycle the package had: runtime imports telemetry, telemetry imports runtime's
    # ThreadState under TYPE_CHECKING.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .runtime import Runtime\n")
    (pkg / "runtime.py").write_text("from . import telemetry\nclass ThreadState: pass\n")
    (pkg / "telemetry.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .runtime import ThreadState\n"
        "def later():\n    from . import runtime\n")
    assert find_cycle(module_level_imports(pkg, "pkg")) == ["pkg.runtime", "pkg.telemetry",
                                                            "pkg.runtime"]
    (pkg / "telemetry.py").write_text("def later():\n    from .runtime import ThreadState\n")
    assert find_cycle(module_level_imports(pkg, "pkg")) is None   # a call-time import is no edge


def test_each_user_runtime_module_imports_first_in_a_fresh_interpreter():
    """Each module imported first in an interpreter of its own (the ones that import TensorFlow
    at their top, keras.py, are left to the graph check: seconds each)."""
    for path in sorted([*(ROOT / "malleable_runtime").glob("*.py"),
                        *(ROOT / "malleable_tf").glob("*.py")]):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Import) and any(a.name == "tensorflow" for a in n.names)
               for n in tree.body):
            continue
        package = path.parent.name
        name = package if path.name == "__init__.py" else f"{package}.{path.stem}"
        done = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"import {name}: {done.stderr}"


def public_api() -> set[str]:
    tree = ast.parse((ROOT / "malleable_tf" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__"
                                                for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("malleable_tf/__init__.py has no __all__")


# Where the API is used (the two packages that define it are where it is made, not used).
FRONT_DOOR_DIRS = ("examples", "tests", "benchmarks", "scripts", "sbatch_templates",
                   "slurm_plugin", "docs")

DOC_IMPORT = re.compile(
    r"from[ \t]+(malleable_tf|malleable_runtime)\.(\w+)[ \t]+import[ \t]+\(?([\w \t,]+)")


def back_doors(paths, api: set[str]) -> list[str]:
    """Imports of an API name from a module of the user runtime (code, and code lines in
    docs)."""
    bad = []
    for path in paths:
        text = path.read_text(errors="replace")
        if path.suffix == ".py":
            found = [(n.module, [a.name for a in n.names]) for n in ast.walk(ast.parse(text))
                     if isinstance(n, ast.ImportFrom) and n.level == 0
                     and (n.module or "").startswith(("malleable_tf.", "malleable_runtime."))]
        else:
            found = [(f"{p}.{m}", names.split(",")) for p, m, names in DOC_IMPORT.findall(text)]
        for module, names in found:
            wrong = api & {n.strip() for n in names}
            if wrong:
                bad.append(f"{path}: from {module} import {sorted(wrong)}")
    return bad


def test_the_api_has_one_front_door():
    """The API (``malleable_tf.__all__``) is imported from ``malleable_tf`` everywhere in the
    repository, code and docs: never from the module that defines a name or imports it."""
    api = public_api()
    import malleable_tf
    assert all(hasattr(malleable_tf, n) for n in api)
    paths = [ROOT / "README.md"] + [p for d in FRONT_DOOR_DIRS
                                    for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md")]
    bad = back_doors(paths, api)
    assert not bad, "import these from malleable_tf: " + "; ".join(bad)
    # runtime.py re-exports nothing of control's any more.
    import malleable_runtime.runtime as runtime_module
    assert not hasattr(runtime_module, "parse_signal_spec")
    assert not hasattr(runtime_module, "DEFAULT_SIGNALS")


def test_the_front_door_check_can_fail(tmp_path):
    code, doc = tmp_path / "t.py", tmp_path / "d.md"
    code.write_text("from malleable_runtime.runtime import (Action,\n    MalleableError)\n"
                    "from malleable_runtime.runtime import Runtime\n"
                    "from malleable_tf.keras import MalleableError\n")
    doc.write_text("    from malleable_runtime.state import ThreadState\n")
    assert back_doors([code, doc], public_api()) == [
        f"{code}: from malleable_runtime.runtime import ['Action', 'MalleableError']",
        f"{code}: from malleable_tf.keras import ['MalleableError']",
        f"{doc}: from malleable_runtime.state import ['ThreadState']"]


BENCHMARK_GROUPS = ("node", "framework", "simulator", "cluster")


def benchmark_problems(folder: Path) -> list[str]:
    """Benchmarks are modules of the ``benchmarks`` package, grouped by what they measure: none
    edits sys.path or imports a sibling by its bare name (both only work from one folder)."""
    problems = []
    siblings = {p.stem for p in folder.rglob("*.py")}
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder)
        if len(rel.parts) > 1 and rel.parts[0] not in BENCHMARK_GROUPS:
            problems.append(f"{rel}: not in a group {BENCHMARK_GROUPS}")
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == "path"
                    and isinstance(node.value, ast.Name) and node.value.id == "sys"):
                problems.append(f"{rel}:{node.lineno}: uses sys.path")
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0
                     else [])
            problems += [f"{rel}:{node.lineno}: imports {n} by its bare name"
                         for n in names if n.split(".")[0] in siblings]
    return sorted(problems)


def test_benchmarks_are_grouped_modules_without_path_edits():
    assert (ROOT / "benchmarks" / "__init__.py").exists()
    assert benchmark_problems(ROOT / "benchmarks") == []


def test_the_benchmark_check_can_fail(tmp_path):
    (tmp_path / "node").mkdir()
    (tmp_path / "misc").mkdir()
    (tmp_path / "common.py").write_text("")
    (tmp_path / "node" / "a.py").write_text("import sys\nsys.path.insert(0, '..')\n"
                                            "from common import x\n")
    (tmp_path / "misc" / "b.py").write_text("")
    assert benchmark_problems(tmp_path) == [
        "misc/b.py: not in a group ('node', 'framework', 'simulator', 'cluster')",
        "node/a.py:2: uses sys.path", "node/a.py:3: imports common by its bare name"]
