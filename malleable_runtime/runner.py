"""The runner every framework package shares: ``python -m malleable_<framework>.run SCRIPT``
starts the framework's runtime, then runs SCRIPT (or ``-m MODULE``) as ``__main__`` the way
``python SCRIPT ARGS`` would: ``sys.argv`` is ``[SCRIPT, *ARGS]``, ``sys.path[0]`` is the
script's folder, and its exit code is the process's (``sys.exit`` passes through; an uncaught
exception exits 1 with its traceback). A framework's run module gives ``main`` its name, its
start function and its help text (``malleable_tf.run``, ``malleable_torch.run``).
"""
from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import os
import runpy
import sys
from dataclasses import dataclass
from typing import Callable

USAGE = "usage: python -m {prog} SCRIPT [ARGS...]  |  -m MODULE [ARGS...]"


class UsageError(ValueError):
    pass


@dataclass(frozen=True)
class Program:
    """What to run: a script path or a module name, and its own arguments."""
    path: str | None
    module: str | None
    args: list[str]

    @property
    def argv(self) -> list[str]:
        return [self.path or self.module or "", *self.args]


MAX_SCRIPT_BYTES = 4 << 20   # a larger script is not read for what it uses


@dataclass(frozen=True)
class SourceFacts:
    """What a script's source says it uses, read without running it (a launcher's or runner's
    choice of framework and strategy)."""

    imports: tuple[str, ...]    # the top-level modules it imports, in source order
    names: frozenset[str]       # every name, attribute and part of an imported module it mentions


def read_head(path: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read(MAX_SCRIPT_BYTES + 1)
    if len(data) > MAX_SCRIPT_BYTES:
        raise ValueError("too large to scan")
    return data


def source_facts(path: str, read: Callable[[str], bytes] = read_head) -> SourceFacts | None:
    """The script's imports and names; None when it cannot be read or parsed."""
    try:
        tree = ast.parse(read(path))
    except (OSError, SyntaxError, ValueError):
        return None
    imports: list[tuple[int, int, str]] = []
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports += [(node.lineno, node.col_offset, a.name.split(".")[0]) for a in node.names]
            names.update(part for a in node.names for part in a.name.split("."))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imports.append((node.lineno, node.col_offset, node.module.split(".")[0]))
            names.update(node.module.split("."))
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    return SourceFacts(tuple(m for _, _, m in sorted(imports)), frozenset(names))


def module_exists(name: str) -> bool:
    """Whether the top-level package of ``name`` can be found (importing nothing: a package
    that imports TensorFlow must not do so before init)."""
    top = name.split(".")[0]
    try:   # the current folder too: run() puts it first on the path, as python -m does
        return (importlib.util.find_spec(top) or
                importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])) is not None
    except (ImportError, ValueError):
        return False


def parse_args(args: list[str], *, is_file=os.path.isfile,
               module_exists=module_exists) -> Program | None:
    """The runner's own command line; None for --help. Everything after SCRIPT (or -m MODULE)
    belongs to the script, options included."""
    if not args:
        raise UsageError("no script given")
    first = args[0]
    if first in ("-h", "--help"):
        return None
    if first == "--":
        args = args[1:]
        if not args:
            raise UsageError("no script given after --")
        first = args[0]
    elif first == "-m" or (first.startswith("-m") and len(first) > 2):
        module = first[2:] or (args[1] if len(args) > 1 else "")
        rest = args[1:] if first != "-m" else args[2:]
        if not module or module.startswith("-"):
            raise UsageError("-m needs a module name")
        if not module_exists(module):
            raise UsageError(f"no module named {module.split('.')[0]!r}")
        return Program(None, module, list(rest))
    elif first.startswith("-") and first != "-":
        raise UsageError(f"unknown option {first!r} (options for the script go after it)")
    if first == "-":
        raise UsageError("a script from standard input cannot be run: give its path")
    if not is_file(first):
        what = "is a folder, not a script" if os.path.isdir(first) else "no such file"
        raise UsageError(f"{first}: {what}")
    return Program(first, None, list(args[1:]))


def run(program: Program) -> None:
    """Run the script or module as ``__main__``, like the interpreter would."""
    sys.argv = program.argv
    if program.path is not None:
        folder = os.path.dirname(os.path.abspath(program.path))
        if sys.path:
            sys.path[0] = folder
        else:
            sys.path.insert(0, folder)
        runpy.run_path(program.path, run_name="__main__")
    else:
        # Like ``python -m``: the current folder first on the path.
        cwd = os.getcwd()
        if sys.path:
            sys.path[0] = cwd
        else:
            sys.path.insert(0, cwd)
        runpy.run_module(program.module, run_name="__main__", alter_sys=True)


def main(argv: list[str] | None, *, prog: str, start: Callable[[Program], object],
         start_name: str, doc: str) -> int:
    """Parse the runner's command line, ``start(program)`` the framework's runtime
    (``start_name``: what the user would call, for the error), run the program.
    Exit codes: 2 for a bad command line, 1 when ``start()`` fails (nothing runs), else 0 (the
    program's own ``sys.exit`` passes through)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        program = parse_args(args)
    except UsageError as exc:
        print(f"{prog}: {exc}\n{USAGE.format(prog=prog)}", file=sys.stderr)
        return 2
    if program is None:
        print(doc)
        return 0
    try:
        start(program)
    except Exception as exc:  # noqa: BLE001 - a bad setting, a failed build: say so, run nothing
        print(f"{prog}: {start_name} failed, {program.argv[0]} not started: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    run(program)
    return 0
