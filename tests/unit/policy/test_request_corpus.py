"""request.py's parsers and job_submit.lua's, run on one corpus: for every case the same
refusal or the same result (AdminComment's normal form at submit, the parsed update at update).
The Lua side is the rendered script's own slurm_job_submit and slurm_job_modify, in a real
Lua 5.1, once per corpus (a driver loops over the cases). Hand-picked cases, then
hypothesis-made ones (derandomized: the same on every run)."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from slurm_plugin.hooks.install import render_job_submit

from ..fakes import LUA_UPVALUE
from malleable_policy.request import (GRAMMAR, Grammar, RequestError, submit_request,
                                              update_request)

LUA = next((p for p in map(shutil.which, ("lua5.1", "lua", "luajit")) if p), None)
SITE = GRAMMAR.for_site(64)      # a site's limit on cores per node caps both parsers alike
MALLEABLE_JOB = "malleable:min=1,max=node,weight=1"


@dataclass(frozen=True)
class SubmitCase:
    comment: str | None
    spank_job_env: tuple[str, ...] | None    # None: Slurm passes nil (no entries)


@dataclass(frozen=True)
class UpdateCase:
    comment: str | None


Case = SubmitCase | UpdateCase

DRIVER = r"""
local said = nil
slurm = {SUCCESS = 0, ERROR = -1,
         log_user = function(...) said = string.format(...) end,
         log_info = function(...) said = string.format(...) end}
if MODULE then    -- the module form: a site's job_submit.lua calls its two functions
   local m = dofile(SCRIPT)
   slurm_job_submit, slurm_job_modify = m.job_submit, m.job_modify
else
   assert(dofile(SCRIPT) == slurm.SUCCESS)
end

local parse_update = assert(upvalue(slurm_job_modify, "parse_update"))

local function decode(field)     -- "-": nil; "x" and hex: the bytes
   if field == "-" then return nil end
   return (string.gsub(string.sub(field, 2), "..",
                       function(h) return string.char(tonumber(h, 16)) end))
end

local function refused(rc)
   if said == nil then return "refused without a message" end
   return "refused"
end

for line in io.lines(CASES) do
   local fields = {}
   for f in string.gmatch(line, "%S+") do fields[#fields + 1] = f end
   said = nil
   if fields[1] == "submit" then
      local desc = {comment = decode(fields[2])}
      if fields[3] ~= "nil" then        -- Slurm's table: keys from 0
         desc.spank_job_env = {}
         for i = 3, #fields do desc.spank_job_env[i - 3] = decode(fields[i]) end
      end
      local rc = slurm_job_submit(desc, {}, 1000)
      if rc == slurm.ERROR then print(refused())
      elseif rc ~= slurm.SUCCESS then print("rc " .. tostring(rc))
      elseif desc.admin_comment == nil then print("rigid")
      else print("ok " .. desc.admin_comment) end
   else
      local comment = decode(fields[2])
      local rec = {job_id = 7, user_id = 1000, admin_comment = MALLEABLE_JOB}
      local rc = slurm_job_modify({comment = comment}, rec, {}, 1000)
      if rc == slurm.ERROR then print(refused())
      else
         local items = nil
         if comment ~= nil then items = parse_update(comment) end
         if items == nil then print("none")
         else
            print(string.format("ok cpus=%s,min=%s,max=%s", tostring(items.cpus or "-"),
                                tostring(items.min or "-"), tostring(items.max or "-")))
         end
      end
   end
end
"""


def _field(text: str | None) -> str:
    return "-" if text is None else "x" + text.encode().hex()


def _line(case: Case) -> str:
    if isinstance(case, UpdateCase):
        return f"update {_field(case.comment)}"
    env = "nil" if case.spank_job_env is None else " ".join(map(_field, case.spank_job_env))
    return f"submit {_field(case.comment)} {env}".rstrip()


def python_outcome(case: Case, grammar: Grammar) -> str:
    try:
        if isinstance(case, SubmitCase):
            spec = submit_request(case.comment, case.spank_job_env, grammar)
            return "rigid" if spec is None else "ok " + spec.normal_form()
        up = update_request(case.comment, grammar)
    except RequestError:
        return "refused"
    if up is None:
        return "none"
    mx = "node" if up.max_is_node else (up.max_cpus or "-")
    return f"ok cpus={up.cpus or '-'},min={up.min_cpus or '-'},max={mx}"


def lua_outcomes(cases: list[Case], grammar: Grammar, folder: Path, *, module: bool = False
                 ) -> list[str]:
    """Every case through the rendered job_submit.lua (or, with ``module``, through the
    module form a site's own script calls), one Lua process for all."""
    assert LUA is not None, "no Lua interpreter: apt-get install lua5.1 (scripts/setup.sh does)"
    script, corpus, driver = folder / "job_submit.lua", folder / "cases", folder / "driver.lua"
    max_cpus = None if grammar.max_value == GRAMMAR.max_value else grammar.max_value
    script.write_text(render_job_submit(folder / "events", max_cpus=max_cpus, module=module))
    corpus.write_text("".join(_line(c) + "\n" for c in cases))
    driver.write_text(f"SCRIPT, CASES = {str(script)!r}, {str(corpus)!r}\n"
                      f"MODULE = {'true' if module else 'false'}\n"
                      f"MALLEABLE_JOB = {MALLEABLE_JOB!r}\n" + LUA_UPVALUE + DRIVER)
    out = subprocess.run([LUA, str(driver)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def assert_agree(cases: list[Case], grammar: Grammar, folder: Path) -> None:
    python = [python_outcome(c, grammar) for c in cases]
    for module in (False, True):
        lua = lua_outcomes(cases, grammar, folder, module=module)
        assert len(lua) == len(cases)
        disagree = [(c, p, lu) for c, p, lu in zip(cases, python, lua) if p != lu]
        assert not disagree, (f"{'module' if module else 'script'}:\n" + "\n".join(
            f"{c}: python {p!r}, lua {lu!r}" for c, p, lu in disagree[:10]))


# --- the hand-picked corpus --------------------------------------------------------------------

COMMENTS = [
    None, "", "run 7", "malleable:", "malleable:min=1", "malleable:min=1,max=8",
    "malleable:max=node,min=2,weight=5", "malleable:min=0001", "malleable:min=00001",
    "malleable:min=64", "malleable:min=65", "malleable:max=4096", "malleable:max=4097",
    "malleable:weight=100", "malleable:weight=101", "malleable:min=3,max=2",
    "malleable:min=2,max=2",
    "malleable:min=1,min=2", "malleable:cpus=2", "malleable:cpus=0", "malleable:min=1 ,max=2",
    "malleable:min=1,max=2;rm", "malleable:x=1", "malleable:min=node", "malleable:cpus=node",
    "malleable:min=1,", "malleable:,min=1", "malleable:min=1,,max=2", "malleable:min=2\n",
    "malleable:MIN=1", "malleable:min=٣", "malleable:min=²", "malleable:min=-1",
    "malleable:min=+1", "malleable:min=0x1", "malleable:min=1e1", "malleable:max=Node",
    "malleable:cpus=3", "malleable:cpus=3,min=2,max=node", "malleable:min=2,max=node",
    "malleable:max=1,min=2", "malleable:cpus=1,cpus=1", "malleable:weight=2", "malleable:min",
    "malleable:=1", "malleable:min==1", "malleablemin=1", "malleable", "Malleable:min=1",
    "MALLEABLE:", "maleable:min=1", "malleable=1", " malleable:min=1", "\tmalleable:",
    "\x0bmalleable:", "malleabel:", "mallable:", "malleablee:", "mmalleablee:", "mallea:",
    "malleable-x", "malleability", "malleability:", "mallet:", "available:", "readable:",
    "my malleable run", "1 malleable:min=1", "ｍalleable:min=1", "malléable:min=1",
    "malleable:min=1\x00", "malleable:" + "cpus=1," * 500, "x" * 3000,
]
OPTIONS = [
    "off", "1", "2:8", "2:8:3", "1:node", "1:node:100", "4096", "4097", "64", "65", "0", "",
    ":", "1:", "1::2", ":1", "2:1", "2:2", "1:2:3:4", "1:2:101", "1:2:0", "node", "OFF", "Off",
    "off:1", "1:NODE", "00001", "0001:0002", "1,2", "-1", " 1", "1 ", "1\n", "٣", "1:node:",
    "min=1", "malleable:min=1", "1:4096:100", "=1", "1=2", ":" * 1000, "1" * 2000,
]
ENV_NAMES = ["MALLEABLE", "SPANK_MALLEABLE", "malleable", "SPANK_MALLEABLEX", "MALLEABLE ",
             "SPANK_SPANK_MALLEABLE", "HOME"]


def hand_corpus() -> list[Case]:
    cases: list[Case] = [SubmitCase(c, None) for c in COMMENTS]
    cases += [UpdateCase(c) for c in COMMENTS]
    cases += [SubmitCase(None, (f"{name}={value}",)) for name in ENV_NAMES[:2]
              for value in OPTIONS]
    cases += [SubmitCase(None, (f"{name}=1:4",)) for name in ENV_NAMES]
    cases += [SubmitCase(comment, ("HOME=/h", f"MALLEABLE={value}"))
              for comment in (None, "run 7", "malleable:min=2", "Malleable:", "malleable:min=0")
              for value in ("2", "off", "0")]
    cases += [SubmitCase(None, env) for env in [
        (), ("MALLEABLE",), ("MALLEABLE=1", "MALLEABLE=1"), ("MALLEABLE=1", "SPANK_MALLEABLE=2"),
        ("MALLEABLE=a=b",), ("=MALLEABLE=1",), ("MALLEABLE=1=",)]]
    return cases


@pytest.mark.parametrize("grammar", [GRAMMAR, SITE], ids=["default", "site-64"])
def test_python_and_lua_agree_on_the_hand_corpus(grammar, tmp_path):
    assert_agree(hand_corpus(), grammar, tmp_path)


def test_the_corpus_has_every_outcome():
    """A corpus that only refuses, or never refuses, would agree trivially."""
    outcomes = {python_outcome(c, GRAMMAR).split(" ")[0] + type(c).__name__
                for c in hand_corpus()}
    assert outcomes == {"okSubmitCase", "rigidSubmitCase", "refusedSubmitCase", "okUpdateCase",
                        "noneUpdateCase", "refusedUpdateCase"}


# --- hypothesis-made corpora -------------------------------------------------------------------

PARTS = st.sampled_from(["min", "max", "weight", "cpus", "node", "off", "=", ",", ":", "0", "1",
                         "4", "64", "65", "100", "101", "4096", "4097", "9999", "00001", "²",
                         "٣", " ", "\n", "\t", "x", "M", "é", "-"])
NEAR_WORDS = st.sampled_from(["malleable", "Malleable", "MALLEABLE", "maleable", "mallable",
                              "malleabel", "malleablee", "malleabl", "malle", "malleability",
                              "mall", "mallet", "xmalleablex", "mALLeaBLE", " malleable",
                              "\tmalleable", "\nmalleable", "\x0bmalleable", "ｍalleable"])
comments = st.one_of(
    st.none(), st.text(max_size=40),
    st.lists(PARTS, max_size=12).map("".join),
    st.lists(PARTS, max_size=12).map(lambda p: "malleable:" + "".join(p)),
    st.tuples(NEAR_WORDS, st.sampled_from([":", "=", " :", "", "-", ";"]),
              st.lists(PARTS, max_size=6).map("".join)).map("".join),
    st.text(alphabet="malebMALEB :=,", max_size=14),
    st.lists(st.tuples(st.sampled_from(["min", "max", "weight", "cpus"]),
                       st.integers(0, 5000).map(str) | PARTS), max_size=4).map(
        lambda items: "malleable:" + ",".join(f"{k}={v}" for k, v in items)),
    # Mostly good ones: small numbers, each key once.
    st.lists(st.tuples(st.sampled_from(["min", "max", "weight", "cpus"]),
                       st.integers(1, 70).map(str) | st.just("node")),
             max_size=3, unique_by=lambda item: item[0]).map(
        lambda items: "malleable:" + ",".join(f"{k}={v}" for k, v in items)))
option_values = st.one_of(
    st.text(max_size=20), st.lists(PARTS, max_size=8).map("".join),
    st.lists(st.integers(0, 5000).map(str) | st.sampled_from(["node", "off", ""]),
             min_size=1, max_size=4).map(":".join),
    st.lists(st.integers(1, 70).map(str) | st.just("node"), min_size=1, max_size=3).map(
        ":".join))
env_entries = st.one_of(
    st.tuples(st.sampled_from(ENV_NAMES), option_values).map("=".join), st.text(max_size=20))
submit_cases = st.builds(
    SubmitCase, comment=comments,
    spank_job_env=st.none() | st.lists(env_entries, max_size=3).map(tuple)
    | option_values.map(lambda v: (f"MALLEABLE={v}",)))
update_cases = st.builds(UpdateCase, comment=comments)
# No shrinking: every step would run Lua again, and a failure already lists its cases.
CORPORA = settings(derandomize=True, database=None, deadline=None, max_examples=15,
                   phases=(Phase.explicit, Phase.generate),
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.function_scoped_fixture])


@CORPORA
@given(cases=st.lists(submit_cases | update_cases, min_size=100, max_size=200))
def test_python_and_lua_agree_on_generated_corpora(cases, tmp_path):
    assert_agree(cases, GRAMMAR, tmp_path)


@CORPORA
@given(cases=st.lists(submit_cases | update_cases, min_size=100, max_size=200))
def test_python_and_lua_agree_on_generated_corpora_at_a_site(cases, tmp_path):
    assert_agree(cases, SITE, tmp_path)
