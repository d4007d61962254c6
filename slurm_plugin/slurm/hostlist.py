"""Slurm hostlist expressions ("n[1-3,5],gpu01") to plain node names. Pure."""
from __future__ import annotations

import re

_BRACKET = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<ranges>[^\[\]]+)\](?P<suffix>.*)$")


def _split_top_level(expr: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced brackets in hostlist {expr!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced brackets in hostlist {expr!r}")
    parts.append("".join(cur))
    return [p for p in parts if p]


def _expand_one(item: str) -> list[str]:
    m = _BRACKET.match(item)
    if not m:
        if "[" in item or "]" in item:
            raise ValueError(f"malformed hostlist item {item!r}")
        return [item]
    names = []
    for rng in m["ranges"].split(","):
        lo, sep, hi = rng.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"malformed range {rng!r} in {item!r}")
        width = len(lo)  # keep zero padding: gpu[01-03]
        for i in range(int(lo), int(hi if sep else lo) + 1):
            for rest in _expand_one(m["suffix"]) if m["suffix"] else [""]:
                names.append(f"{m['prefix']}{i:0{width}d}{rest}")
    return names


def expand_hostlist(expr: str) -> list[str]:
    expr = expr.strip()
    if not expr or expr == "(null)":
        return []
    out: list[str] = []
    for item in _split_top_level(expr):
        out.extend(_expand_one(item))
    return out
