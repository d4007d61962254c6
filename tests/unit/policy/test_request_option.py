"""request.py as the one source of the grammar: ``--malleable=MIN[:MAX[:WEIGHT]]|off``, the
submit rules job_submit.lua follows (option or comment, typos of the prefix), and the Lua
constants rendered from it."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from malleable_policy.request import (GRAMMAR, MAX_VALUE, Grammar, MalleableSpec as M,
                                              RequestError, Update, is_near_miss, lua_literal,
                                              option_value, parse_option, submit_request,
                                              update_request)

TEMPLATE = Path(__file__).resolve().parents[3] / "slurm_plugin" / "hooks" / "templates" / \
    "job_submit.lua.tmpl"
LUA = next((p for p in map(shutil.which, ("lua5.1", "lua", "luajit")) if p), None)


@pytest.mark.parametrize("value,spec", [
    ("1", M(1, None, 1)), ("2:8", M(2, 8, 1)), ("2:8:3", M(2, 8, 3)), ("1:node", M(1, None, 1)),
    ("4:node:100", M(4, None, 100)), ("4096", M(4096, None, 1)), ("3:3", M(3, 3, 1)),
    ("0002:0008", M(2, 8, 1)), ("off", None),
])
def test_parse_option(value, spec):
    assert parse_option(value) == spec
    if spec is not None:      # the same bounds as the comment's normal form says
        assert submit_request(spec.normal_form()) == spec


@pytest.mark.parametrize("value", [
    "", "0", "4097", "2:1", "1:2:101", "1:2:0", "1:2:3:4", "1::2", ":", "1:", "node", "x",
    "1 ", " 1", "OFF", "Off", "off:1", "1:NODE", "00001", "1,2", "-1", "+1", "٣", "1\n",
    "min=1", "1:node:node",
])
def test_parse_option_refuses_naming_the_grammar(value):
    with pytest.raises(RequestError) as err:
        parse_option(value)
    assert "want --malleable=MIN[:MAX[:WEIGHT]] or off, e.g. --malleable=2:node:1" in str(err.value)


def test_a_sites_limit_caps_the_option_and_the_comment():
    site = GRAMMAR.for_site(64)
    assert parse_option("64", site) == M(64)
    with pytest.raises(RequestError, match="1 to 64"):
        parse_option("65", site)
    with pytest.raises(RequestError, match=r"out of range \(1 to 64\)"):
        submit_request("malleable:max=65", grammar=site)
    assert GRAMMAR.for_site(10_000).max_value == MAX_VALUE and GRAMMAR.for_site(None) is GRAMMAR
    for bad in (0, -1, True, "8"):
        with pytest.raises(ValueError):
            GRAMMAR.for_site(bad)


def test_the_option_comes_from_either_spank_name_once():
    assert option_value(None) is None and option_value(["HOME=/x", "MALLEABLE"]) is None
    assert option_value(["MALLEABLE=2:4"]) == "2:4"
    assert option_value(["X=1", "SPANK_MALLEABLE=a=b"]) == "a=b"
    assert option_value(["SPANK_SPANK_MALLEABLE=1", "MALLEABLEX=1", "malleable=1"]) is None
    with pytest.raises(RequestError, match="given twice"):
        option_value(["MALLEABLE=1", "SPANK_MALLEABLE=1"])


def test_submit_rules():
    assert submit_request(None) is None and submit_request("run 7") is None
    assert submit_request(None, ["MALLEABLE=off"]) is None
    assert submit_request("run 7", ["MALLEABLE=off"]) is None
    assert submit_request("run 7", ["MALLEABLE=2"]) == M(2)
    assert submit_request("malleable:min=2,weight=3") == M(2, None, 3)
    for comment in ("malleable:min=2", "malleable:", "Malleable:", "maleable:min=1"):
        with pytest.raises(RequestError, match="use --malleable only"):
            submit_request(comment, ["MALLEABLE=2"])
        with pytest.raises(RequestError, match="use --malleable only"):
            submit_request(comment, ["MALLEABLE=off"])
    with pytest.raises(RequestError, match=re.escape("(want malleable:min=N,max=N|node,weight=N)")):
        submit_request("malleable:min=3,max=2")


@pytest.mark.parametrize("text", [
    "maleable:min=1", "Malleable:min=1", "MALLEABLE:", "malleable=1", "malleable", "mallable:",
    " malleable:min=1", "\tmalleable:", "\x0bmalleable:", "malleabel:", "malleablee:x",
    "malleable :", "malleable-test", "mALLEABLe", "alleable:", "malleab:",
])
def test_near_misses(text):
    assert is_near_miss(text)
    with pytest.raises(RequestError, match="looks like a malleability request"):
        submit_request(text)
    with pytest.raises(RequestError, match="looks like a malleability request"):
        update_request(text)


@pytest.mark.parametrize("text", [
    None, "", "malleable:", "malleable:min=x", "run 7", "mallet: big", "available:", "readable",
    "malleability", "my malleable job", "1 malleable:", "ｍalleable:", "malléable:", "mall",
    "\u00a0malleable:",    # not C's isspace: the first word is empty
])
def test_not_near_misses(text):
    assert not is_near_miss(text)


def test_update_rules():
    assert update_request(None) is None and update_request("run 7") is None
    assert update_request("malleable:cpus=3") == Update(cpus=3)
    with pytest.raises(RequestError):
        update_request("malleable:")


def test_no_grammar_constant_is_kept_in_the_lua_template():
    """Every constant comes from request.py: the template's code (comments aside) names none."""
    code = "\n".join(line.split("--", 1)[0] for line in TEMPLATE.read_text().splitlines())
    for constant in ('"malleable:"', "malleable:min", '"malleable"', '"node"', '"off"',
                     "MALLEABLE", "4096", "100", '"min"', '"max"', '"weight"', '"cpus"', "min=",
                     "max=", "weight="):
        assert constant not in code, constant
    assert "${grammar}" in code


@pytest.mark.skipif(LUA is None, reason="test_job_submit_lua.py requires Lua already")
def test_lua_literals_read_back_byte_for_byte(tmp_path):
    texts = ['a"b', "back\\slash", "new\nline", "\t\x0b\x0c\r", "\x00\x01", "é ٣ ｍ", "]]",
             "\\0091", "$x ${y}", "%d %s"]
    script = tmp_path / "read.lua"
    script.write_text("".join(f"io.write({lua_literal(t)}, '\\255')\n" for t in texts))
    out = subprocess.run([LUA, str(script)], capture_output=True, timeout=30, check=True).stdout
    assert out.split(b"\xff")[:-1] == [t.encode() for t in texts]


def test_grammar_refuses_separators_lua_patterns_would_misread():
    with pytest.raises(ValueError):
        Grammar(option_separator="%")
    with pytest.raises(ValueError):
        Grammar(leading_space=" ]")
