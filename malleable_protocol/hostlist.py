"""Slurm's compressed lists to plain ones: hostlist expressions ("n[1-3,5],gpu01") to node
names, and repeated counts ("2(x3),1", SLURM_TASKS_PER_NODE) to one count per node. Pure;
shared by the Slurm side and the workers (``malleable_tf.multiworker``)."""
from __future__ import annotations

import re

_BRACKET = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<ranges>[^\[\]]+)\](?P<suffix>.*)$")


def _split_top_level(expr: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced brackets in hostlist {expr[:64]!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced brackets in hostlist {expr[:64]!r}")
    parts.append("".join(cur))
    return [p for p in parts if p]


MAX_NAMES = 1 << 16     # more nodes than any cluster has: a larger expansion is refused
_GROUP = re.compile(r"\[([^\[\]]+)\]")


def _expand_one(item: str, budget: int) -> list[str]:
    """The names of one item ("gpu[01-03]x[1-2]"), left to right without recursion; at most
    ``budget`` of them (ValueError beyond)."""
    names = [""]
    pos = 0
    for m in _GROUP.finditer(item):
        literal = item[pos:m.start()]
        if "[" in literal or "]" in literal:
            raise ValueError(f"malformed hostlist item {item[:64]!r}")
        numbers: list[str] = []
        for rng in m[1].split(","):
            lo, sep, hi = rng.partition("-")
            if not (lo.isascii() and lo.isdigit() and len(lo) <= 9) or \
                    (sep and not (hi.isascii() and hi.isdigit() and len(hi) <= 9)):
                raise ValueError(f"malformed range {rng[:32]!r} in {item[:64]!r}")
            first, last = int(lo), int(hi if sep else lo)
            if (last - first + 1) * len(names) + len(numbers) * len(names) > budget:
                raise ValueError(f"hostlist {item[:64]!r} names more than {MAX_NAMES} nodes")
            numbers += [f"{i:0{len(lo)}d}" for i in range(first, last + 1)]  # keeps gpu[01-03]
        if len(numbers) * len(names) > budget:
            raise ValueError(f"hostlist {item[:64]!r} names more than {MAX_NAMES} nodes")
        names = [f"{n}{literal}{i}" for n in names for i in numbers]
        pos = m.end()
    tail = item[pos:]
    if "[" in tail or "]" in tail:
        raise ValueError(f"malformed hostlist item {item[:64]!r}")
    return [f"{n}{tail}" for n in names]


def expand_hostlist(expr: str) -> list[str]:
    expr = expr.strip()
    if not expr or expr == "(null)":
        return []
    out: list[str] = []
    for item in _split_top_level(expr):
        out.extend(_expand_one(item, MAX_NAMES - len(out)))
    return out


_COUNT = re.compile(r"^([0-9]{1,6})(?:\(x([0-9]{1,6})\))?$")


def expand_counts(expr: str) -> list[int]:
    """``SLURM_TASKS_PER_NODE``-style counts: "2(x3),1" -> [2, 2, 2, 1]. ValueError on
    anything else, or past ``MAX_NAMES`` entries."""
    out: list[int] = []
    for item in expr.strip().split(","):
        m = _COUNT.match(item.strip())
        if not m:
            raise ValueError(f"malformed count {item[:32]!r} in {expr[:64]!r}")
        times = int(m[2] or 1)
        if len(out) + times > MAX_NAMES:
            raise ValueError(f"{expr[:64]!r} counts more than {MAX_NAMES} nodes")
        out += [int(m[1])] * times
    return out
