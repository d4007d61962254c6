"""The malleability request grammar, its one source: job_submit.lua's constants are rendered
from ``GRAMMAR`` at install (``lua_grammar_source``); only its logic is Lua, and
tests/unit/policy/test_request_corpus.py runs both parsers on one corpus.

How a job asks (sbatch, salloc, srun; the SPANK plugin's option):
    --malleable=MIN[:MAX[:WEIGHT]]     MAX a number or "node" (omitted: node); WEIGHT omitted: 1
    --malleable=off                    explicitly rigid
The plugin hands the value to slurmctld in the job's SPANK environment as MALLEABLE=VALUE
(SPANK_MALLEABLE=VALUE once slurmctld has prefixed it), which any client can set: untrusted.

The older form, still taken:
    request := "malleable:" item ("," item)*
    item    := key "=" value
    at submit (sbatch --comment=...):   min=N  max=N|node  weight=N      (all optional)
    at update (scontrol update JobId=J Comment=...):   cpus=N   and/or   min=N  max=N|node

N is a whole number of at most 4 digits from 1 to 4096, weight from 1 to 100; min <= max;
"node" means every core of the node. Spaces, repeated keys, unknown keys or anything after the
items are refused. The option and a malleable comment together are refused (one request, one
place: --malleable). A comment whose first word is "malleable" give or take two typos, but that
does not start with "malleable:" ("maleable:", "Malleable:", "malleable=") is refused: a typo
never gives a rigid job silently. The normal form written to AdminComment is
"malleable:min=A,max=B,weight=W" (max may be "node").
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Iterable
from malleable_protocol.errors import FixableError

PREFIX = "malleable:"
MAX_VALUE = 4096
MAX_WEIGHT = 100
NODE = "node"
DEFAULT_MIN = 1
DEFAULT_WEIGHT = 1

_ITEM = re.compile(r"([a-z]+)=([0-9a-z]+)")     # ASCII only, as Lua's [a-z] and [0-9]
_DIGITS = re.compile(r"[0-9]+")
_LEADING_WORD = re.compile(r"[A-Za-z]*")


class RequestError(FixableError, ValueError):
    pass


@dataclass(frozen=True)
class Grammar:
    """Every constant of the grammar, the Python parsers' and job_submit.lua's. Only
    ``max_value`` varies: a site's limit on a job's cores per node (``for_site``)."""

    prefix: str = PREFIX
    node: str = NODE
    node_key: str = "max"                 # the only key that may be "node"
    max_value: int = MAX_VALUE
    max_weight: int = MAX_WEIGHT
    max_digits: int = len(str(MAX_VALUE))  # at every site: "00001" is refused everywhere
    default_min: int = DEFAULT_MIN
    default_weight: int = DEFAULT_WEIGHT
    submit_keys: tuple[str, ...] = ("min", "max", "weight")
    update_keys: tuple[str, ...] = ("cpus", "min", "max")
    item_separator: str = ","
    option_keys: tuple[str, ...] = ("min", "max", "weight")      # MIN:MAX:WEIGHT, in order
    option_separator: str = ":"
    option_off: str = "off"
    # The SPANK plugin's spank_job_control_setenv("MALLEABLE", ...); slurmctld prefixes SPANK_.
    option_env_names: tuple[str, ...] = ("MALLEABLE", "SPANK_MALLEABLE")
    near_miss_distance: int = 2           # edits from "malleable" a typo may be
    leading_space: str = " \t\n\v\f\r"    # skipped before a comment's first word (C's isspace)
    normal_form_format: str = PREFIX + "min=%d,max=%s,weight=%d"   # Python's % and Lua's format

    def __post_init__(self) -> None:
        # job_submit.lua puts these in its patterns' character classes: no magic characters.
        for chars in (self.item_separator, self.option_separator, self.leading_space):
            if any(c in "^$()%.[]*+-?=" for c in chars):
                raise ValueError(f"{chars!r}: a Lua pattern's magic character")

    def for_site(self, max_cpus: int | None) -> Grammar:
        """The grammar with a site's limit on cores per node (never above MAX_VALUE)."""
        if max_cpus is None:
            return self
        if isinstance(max_cpus, bool) or not isinstance(max_cpus, int) or max_cpus < 1:
            raise ValueError(f"a site's max_cpus is a whole number >= 1, not {max_cpus!r}")
        return replace(self, max_value=min(max_cpus, MAX_VALUE))

    @property
    def word(self) -> str:
        """The prefix's word ("malleable"), what a near-miss comment starts like."""
        return self.prefix.rstrip(":")

    def upper_bound(self, key: str) -> int:
        return self.max_weight if key == "weight" else self.max_value

    @property
    def option_usage(self) -> str:
        return (f"--malleable=MIN[:MAX[:WEIGHT]] or {self.option_off}, e.g. "
                f"--malleable=2:{self.node}:1 (MIN "
                f"and MAX 1 to {self.max_value}, MAX may be {self.node}, WEIGHT 1 to "
                f"{self.max_weight})")

    @property
    def submit_usage(self) -> str:
        return f"{self.prefix}min=N,max=N|{self.node},weight=N"

    @property
    def update_usage(self) -> str:
        return f"{self.prefix}cpus=N and/or min=N,max=N|{self.node}"


GRAMMAR = Grammar()


@dataclass(frozen=True)
class MalleableSpec:
    """A job's bounds: at least ``min_cpus``, at most ``max_cpus`` (None: the whole node)."""

    min_cpus: int = DEFAULT_MIN
    max_cpus: int | None = None
    weight: int = DEFAULT_WEIGHT

    def normal_form(self) -> str:
        mx = NODE if self.max_cpus is None else str(self.max_cpus)
        return GRAMMAR.normal_form_format % (self.min_cpus, mx, self.weight)

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


def _edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (the caller keeps both words short)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1,
                               previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def is_near_miss(text: str | None, grammar: Grammar = GRAMMAR) -> bool:
    """Does ``text`` start like a request ("Malleable:", "maleable:", "malleable=", " malleable:")
    without being one? Its first word of ASCII letters, lowercased, at most
    ``near_miss_distance`` edits from "malleable"."""
    if text is None or text.startswith(grammar.prefix):
        return False
    leading = _LEADING_WORD.match(text.lstrip(grammar.leading_space))
    word = leading[0] if leading else ""      # it matches the empty word at least
    if abs(len(word) - len(grammar.word)) > grammar.near_miss_distance:
        return False
    return _edit_distance(word.lower(), grammar.word) <= grammar.near_miss_distance


def _value(key: str, text: str, grammar: Grammar) -> int | None:
    """One number in its range, or None for "node" where the key allows it."""
    if text == grammar.node:
        if key != grammar.node_key:
            raise RequestError(f"{key}={grammar.node} is not allowed: only {grammar.node_key} "
                               f"may be {grammar.node!r}")
        return None
    if not _DIGITS.fullmatch(text) or len(text) > grammar.max_digits:
        raise RequestError(f"{key}: {text!r:.32} is not a number of at most "
                           f"{grammar.max_digits} digits")
    if not 1 <= int(text) <= grammar.upper_bound(key):
        raise RequestError(f"{key}={text} out of range (1 to {grammar.upper_bound(key)})")
    return int(text)


def _check_order(min_cpus: int | None, max_cpus: int | None) -> None:
    if min_cpus is not None and max_cpus is not None and max_cpus < min_cpus:
        raise RequestError(f"min={min_cpus} is above max={max_cpus}")


def _items(text: str, allowed: tuple[str, ...], grammar: Grammar) -> dict[str, int | None]:
    """A comment request's items: key -> number, or None for "node"."""
    if not text.startswith(grammar.prefix):
        raise RequestError(f"a malleability request starts with {grammar.prefix!r}")
    body = text[len(grammar.prefix):]
    if not body:
        return {}
    items: dict[str, int | None] = {}
    for part in body.split(grammar.item_separator):
        m = _ITEM.fullmatch(part)      # not match: "$" also matches before a final newline
        if not m:
            raise RequestError(f"malformed item {part!r:.32}: want min=N, max=N|node, weight=N "
                               "or cpus=N")
        key, value = m[1], m[2]
        if key not in allowed:
            raise RequestError(f"{key}= is not allowed here (allowed: "
                               f"{', '.join(sorted(allowed))})")
        if key in items:
            raise RequestError(f"{key}= given twice")
        items[key] = _value(key, value, grammar)
    _check_order(items.get("min"), items.get("max"))
    return items


def _spec(items: dict[str, int | None], grammar: Grammar) -> MalleableSpec:
    min_cpus, weight = items.get("min"), items.get("weight")
    return MalleableSpec(min_cpus=grammar.default_min if min_cpus is None else min_cpus,
                         max_cpus=items.get("max"),
                         weight=grammar.default_weight if weight is None else weight)


def parse_submit(text: str, grammar: Grammar = GRAMMAR) -> MalleableSpec:
    """A submit comment ``malleable:min=N,max=N|node,weight=N`` (the older form)."""
    return _spec(_items(text, grammar.submit_keys, grammar), grammar)


def parse_update(text: str, grammar: Grammar = GRAMMAR) -> Update:
    items = _items(text, grammar.update_keys, grammar)
    if not items:
        raise RequestError("an update names cpus=, min= or max=")
    return Update(cpus=items.get("cpus"), min_cpus=items.get("min"),
                  max_cpus=items.get("max"),
                  max_is_node="max" in items and items["max"] is None)


def parse_option(value: str, grammar: Grammar = GRAMMAR) -> MalleableSpec | None:
    """The value of ``--malleable=MIN[:MAX[:WEIGHT]]``; None for ``off`` (rigid)."""
    if value == grammar.option_off:
        return None
    parts = value.split(grammar.option_separator)
    try:
        if len(parts) > len(grammar.option_keys):
            raise RequestError(f"more than {len(grammar.option_keys)} parts")
        items: dict[str, int | None] = {}
        for key, part in zip(grammar.option_keys, parts):
            if not part:
                raise RequestError("an empty part")
            items[key] = _value(key, part, grammar)
        _check_order(items.get("min"), items.get("max"))
    except RequestError as exc:
        raise RequestError(f"--malleable={value!r:.40}: {exc} (want {grammar.option_usage})") \
            from None
    return _spec(items, grammar)


def option_value(spank_job_env: Iterable[str] | None, grammar: Grammar = GRAMMAR) -> str | None:
    """The ``--malleable`` value among a job's SPANK environment entries ("NAME=VALUE"), or
    None. Any client can send any entries: more than one naming it is refused."""
    found: str | None = None
    for entry in spank_job_env or ():
        name, eq, value = entry.partition("=")
        if eq and name in grammar.option_env_names:
            if found is not None:
                raise RequestError(f"--malleable given twice (want {grammar.option_usage})")
            found = value
    return found


def submit_request(comment: str | None, spank_job_env: Iterable[str] | None = None,
                   grammar: Grammar = GRAMMAR) -> MalleableSpec | None:
    """What job_submit.lua's slurm_job_submit decides for a job's comment and SPANK
    environment: its bounds, None for a rigid job, RequestError for a refusal."""
    option = option_value(spank_job_env, grammar)
    comment_asks = comment is not None and (comment.startswith(grammar.prefix)
                                            or is_near_miss(comment, grammar))
    if option is not None:
        if comment_asks and comment is not None:
            raise RequestError(f"--malleable and --comment={comment[:64]!r} both ask: use "
                               "--malleable only (the comment is the older form of it)")
        return parse_option(option, grammar)
    if comment is None or not comment_asks:
        return None
    if is_near_miss(comment, grammar):
        raise RequestError(f"--comment={comment[:64]!r} looks like a malleability request but "
                           f"does not start with {grammar.prefix!r} (want "
                           f"{grammar.option_usage}, or the older {grammar.submit_usage})")
    try:
        return parse_submit(comment, grammar)
    except RequestError as exc:
        raise RequestError(f"{exc} (want {grammar.submit_usage})") from None


def update_request(comment: str | None, grammar: Grammar = GRAMMAR) -> Update | None:
    """What job_submit.lua's slurm_job_modify decides for a new comment of a malleable job:
    the update, None when the comment is no request, RequestError for a refusal."""
    if comment is None:
        return None
    if is_near_miss(comment, grammar):
        raise RequestError(f"comment {comment[:64]!r} looks like a malleability request but "
                           f"does not start with {grammar.prefix!r} (want {grammar.update_usage})")
    if not comment.startswith(grammar.prefix):
        return None
    return parse_update(comment, grammar)


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


# --- job_submit.lua's constants -----------------------------------------------------------------

# A tuple is a Lua array, a dict a table; their items are LuaValues in turn.
LuaValue = str | int | bool | tuple[Any, ...] | dict[Any, Any]


def lua_literal(value: LuaValue) -> str:
    """Lua 5.1 source for a string, number, boolean, array (tuple) or table (dict)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        # Three-digit decimal escapes for all but plain printable ASCII: no quote, backslash
        # or newline ends the literal early, and no digit after an escape joins it.
        return '"' + "".join(c if " " <= c <= "~" and c not in '"\\' else
                             "".join(f"\\{b:03d}" for b in c.encode()) for c in value) + '"'
    if isinstance(value, tuple):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{lua_literal(k)}] = {lua_literal(v)}"
                               for k, v in value.items()) + "}"
    raise TypeError(f"no Lua literal for {type(value).__name__}")


def lua_grammar_source(grammar: Grammar = GRAMMAR) -> str:
    """``local GRAMMAR = {...}``: every constant job_submit.lua's parser uses."""
    def key_set(keys: tuple[str, ...]) -> dict[str, bool]:
        return {k: True for k in keys}

    all_keys = dict.fromkeys(grammar.submit_keys + grammar.update_keys + grammar.option_keys)
    table: dict[str, LuaValue] = {
        "prefix": grammar.prefix, "word": grammar.word, "node": grammar.node,
        "node_key": grammar.node_key, "max_digits": grammar.max_digits,
        "upper": {k: grammar.upper_bound(k) for k in all_keys},
        "default_min": grammar.default_min, "default_weight": grammar.default_weight,
        "submit_keys": key_set(grammar.submit_keys), "update_keys": key_set(grammar.update_keys),
        "item_separator": grammar.item_separator,
        "option_keys": grammar.option_keys, "option_separator": grammar.option_separator,
        "option_off": grammar.option_off, "option_env_names": key_set(grammar.option_env_names),
        "near_miss_distance": grammar.near_miss_distance,
        "leading_space": grammar.leading_space,
        "normal_form_format": grammar.normal_form_format,
        "option_usage": grammar.option_usage, "submit_usage": grammar.submit_usage,
        "update_usage": grammar.update_usage,
    }
    body = ",\n".join(f"   {name} = {lua_literal(value)}" for name, value in table.items())
    return "local GRAMMAR = {\n" + body + ",\n}"
