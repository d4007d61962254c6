#!/usr/bin/env python3
"""Runs the steps of docs/install.md as written, so the guide is what the tests install by.

    guide.py list                       the steps, in the guide's order
    guide.py show STEP                  a step's commands
    guide.py run STEP [STEP...]         run them (bash -euo pipefail, in the current folder),
                                        each after the `settings` step, so variables set in the
                                        environment (MALLEABLE_FEED_DIR=...) override its defaults
    --guide FILE                        another copy of the guide (default: docs/install.md
                                        beside this script's folder, else the package's copy)

A step is a fenced ```sh block right after a line `<!-- step: NAME -->`. Standard library only:
it runs in the docker-slurm images and the VMs before anything else is installed.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
GUIDES = (HERE.parent / "docs" / "install.md", Path("/usr/share/doc/malleable-slurm/install.md"))
MARKER = re.compile(r"^<!-- step: ([a-z0-9-]+) -->$")
SETTINGS = "settings"


class GuideError(Exception):
    pass


@dataclass(frozen=True)
class Step:
    name: str
    script: str
    line: int          # of the marker, for messages


def parse_steps(text: str) -> list[Step]:
    """The guide's steps in order; a marker not followed by a ```sh block, an unclosed block
    or a name used twice is an error (the guide would say something the tests do not run)."""
    lines = text.splitlines()
    steps: list[Step] = []
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i].strip())
        if not m:
            i += 1
            continue
        name, line = m.group(1), i + 1
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```sh":
            raise GuideError(f"line {line}: step {name!r} is not followed by a ```sh block")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise GuideError(f"line {line}: step {name!r}: the ```sh block is not closed")
        if any(s.name == name for s in steps):
            raise GuideError(f"line {line}: step {name!r} appears twice")
        steps.append(Step(name, "\n".join(lines[i + 2:end]) + "\n", line))
        i = end + 1
    return steps


def script_for(steps: list[Step], names: list[str]) -> str:
    """One bash script: the settings step, then each named step in the order given."""
    by_name = {s.name: s for s in steps}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise GuideError(f"no step {', '.join(unknown)} in the guide (it has: "
                         f"{', '.join(by_name)})")
    parts = [by_name[SETTINGS].script] if SETTINGS in by_name else []
    for name in names:
        if name != SETTINGS:
            parts.append(f"echo '[guide] step {name}' >&2\n{by_name[name].script}")
    return "".join(parts)


def find_guide(given: str | None) -> Path:
    for path in ([Path(given)] if given else GUIDES):
        if path.is_file():
            return path
    raise GuideError(f"no guide at {given or ' or '.join(map(str, GUIDES))}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="guide.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--guide")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    sh = sub.add_parser("show")
    sh.add_argument("step")
    rn = sub.add_parser("run")
    rn.add_argument("steps", nargs="+")
    args = ap.parse_args(argv)
    try:
        guide = find_guide(args.guide)
        steps = parse_steps(guide.read_text())
        if args.command == "list":
            print("\n".join(s.name for s in steps))
            return 0
        if args.command == "show":
            print(script_for(steps, [args.step]), end="")
            return 0
        script = script_for(steps, args.steps)
    except GuideError as exc:
        print(f"guide.py: {exc}", file=sys.stderr)
        return 1
    rc = subprocess.run(["bash", "-euo", "pipefail", "-c", script]).returncode
    if rc:
        print(f"guide.py: steps {' '.join(args.steps)} of {guide} failed (exit {rc})",
              file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
