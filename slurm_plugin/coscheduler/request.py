"""The malleability request grammar, shared in meaning with job_submit.lua.

    request := "malleable:" item ("," item)*
    item    := key "=" value
    at submit (sbatch --comment=...):   min=N  max=N|node  weight=N      (all optional)
    at update (scontrol update JobId=J Comment=...):   cpus=N   and/or   min=N  max=N|node

N is a whole number from 1 to 4096, weight from 1 to 100; min <= max; "max=node" means every
core of the node. Spaces, repeated keys, unknown keys or anything after the items are refused.
The normal form written to AdminComment is "malleable:min=A,max=B,weight=W" (max may be "node").
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "malleable:"
MAX_VALUE = 4096
NODE = "node"
_ITEM = re.compile(r"(min|max|weight|cpus)=([0-9]{1,4}|node)")


class RequestError(ValueError):
    pass


@dataclass(frozen=True)
class MalleableSpec:
    """A job's bounds: at least ``min_cpus``, at most ``max_cpus`` (None: the whole node)."""

    min_cpus: int = 1
    max_cpus: int | None = None
    weight: int = 1

    def normal_form(self) -> str:
        mx = NODE if self.max_cpus is None else str(self.max_cpus)
        return f"{PREFIX}min={self.min_cpus},max={mx},weight={self.weight}"

    def max_on(self, node_cpus: int) -> int:
        return node_cpus if self.max_cpus is None else min(self.max_cpus, node_cpus)


@dataclass(frozen=True)
class Update:
    """What a ``scontrol update ... Comment=malleable:...`` asks for."""

    cpus: int | None = None
    min_cpus: int | None = None
    max_cpus: int | None = None
    max_is_node: bool = False


def is_malleable_text(text: str) -> bool:
    return text.startswith(PREFIX)


def _items(text: str, allowed: set[str]) -> dict[str, str]:
    if not text.startswith(PREFIX):
        raise RequestError(f"a malleability request starts with {PREFIX!r}")
    body = text[len(PREFIX):]
    if not body:
        return {}
    items: dict[str, str] = {}
    for part in body.split(","):
        m = _ITEM.fullmatch(part)      # not match: "$" also matches before a final newline
        if not m:
            raise RequestError(f"malformed item {part!r:.32}: want min=N, max=N|node, weight=N "
                               "or cpus=N")
        key, value = m[1], m[2]
        if key not in allowed:
            raise RequestError(f"{key}= is not allowed here (allowed: {', '.join(sorted(allowed))})")
        if key in items:
            raise RequestError(f"{key}= given twice")
        if value == NODE and key != "max":
            raise RequestError(f"{key}=node is not allowed: only max may be 'node'")
        if value != NODE and not 1 <= int(value) <= (100 if key == "weight" else MAX_VALUE):
            raise RequestError(f"{key}={value} out of range")
        items[key] = value
    return items


def parse_submit(text: str) -> MalleableSpec:
    items = _items(text, {"min", "max", "weight"})
    spec = MalleableSpec(min_cpus=int(items.get("min", 1)),
                         max_cpus=None if items.get("max", NODE) == NODE else int(items["max"]),
                         weight=int(items.get("weight", 1)))
    if spec.max_cpus is not None and spec.max_cpus < spec.min_cpus:
        raise RequestError(f"min={spec.min_cpus} is above max={spec.max_cpus}")
    return spec


def parse_update(text: str) -> Update:
    items = _items(text, {"cpus", "min", "max"})
    if not items:
        raise RequestError("an update names cpus=, min= or max=")
    up = Update(cpus=int(items["cpus"]) if "cpus" in items else None,
                min_cpus=int(items["min"]) if "min" in items else None,
                max_cpus=int(items["max"]) if items.get("max", NODE) != NODE else None,
                max_is_node=items.get("max") == NODE)
    if up.min_cpus is not None and up.max_cpus is not None and up.max_cpus < up.min_cpus:
        raise RequestError(f"min={up.min_cpus} is above max={up.max_cpus}")
    return up


def apply_update(spec: MalleableSpec, up: Update) -> MalleableSpec:
    """The bounds after an update; a cpus= request alone leaves them as they are."""
    new = MalleableSpec(min_cpus=up.min_cpus or spec.min_cpus,
                        max_cpus=None if up.max_is_node else (up.max_cpus or spec.max_cpus),
                        weight=spec.weight)
    if new.max_cpus is not None and new.max_cpus < new.min_cpus:
        raise RequestError(f"min={new.min_cpus} is above max={new.max_cpus}")
    return new


def spec_and_request(admin_comment: str, comment: str) -> tuple[MalleableSpec | None, int | None]:
    """A job's bounds from AdminComment (written by job_submit.lua; users cannot forge it), with
    the updated bounds and requested cores from Comment (the owner's or an admin's scontrol
    update). Malformed text is ignored: it changes nothing."""
    if not is_malleable_text(admin_comment):
        return None, None
    try:
        spec = parse_submit(admin_comment)
    except RequestError:
        return None, None
    requested = None
    if is_malleable_text(comment):
        try:
            up = parse_update(comment)
            spec = apply_update(spec, up)
            requested = up.cpus
        except RequestError:
            pass
    return spec, requested
