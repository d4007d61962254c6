"""The packages' import edges match how they are deployed: malleable_tf and the launcher run
in the user's job and never import the root daemon's package; the protocol imports nothing of
the project and nothing outside the standard library."""
import ast
import sys
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
    for package in ("malleable_tf", "launcher", "malleable_protocol"):
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
