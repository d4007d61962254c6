"""job_submit.lua, rendered by install's renderer and run by a real Lua interpreter (Debian's
slurmctld embeds Lua 5.1) against a stand-in of slurmctld's ``slurm`` table and job records:
the fields read are the ones Slurm 22.05 and 24.11 expose (job_rec.user_id, .job_id,
.admin_comment; job_desc.comment, .spank_job_env, written: job_desc.admin_comment). slurmctld
calls slurm_job_modify before it checks who may update the job, so the hook must not wake the
watcher for anyone else. test_request_corpus.py checks the grammar against request.py's."""
import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_plugin.hooks.install import render_job_submit

from ..fakes import LUA_UPVALUE

LUA = next((p for p in map(shutil.which, ("lua5.1", "lua", "luajit", "lua5.3", "lua5.4")) if p),
           None)


@pytest.fixture(autouse=True)
def lua_interpreter():
    """scripts/setup.sh installs lua5.1: without it this suite fails, it does not skip."""
    assert LUA is not None, "no Lua interpreter: apt-get install lua5.1 (scripts/setup.sh does)"

OWNER, STRANGER = 1000, 1001
MALLEABLE = 'admin_comment = "malleable:min=1,max=node,weight=1"'

# A local of the rendered script, reached through a function that uses it (the tests' way in):
# slurm_job_modify's own, else one of the functions of a table it uses (the script's entry
# points call the module table's functions).


PRELUDE = """
slurm = {SUCCESS = 0, ERROR = -1,
         log_user = function(...) io.stderr:write("user: ", string.format(...), "\\n") end,
         log_info = function(...) io.stderr:write("info: ", string.format(...), "\\n") end}
T = 1000
os.time = function() return T end
local rc = dofile(SCRIPT)
assert(rc == slurm.SUCCESS)
function modify(job_id, user_id, modify_uid, comment)
   local desc = {comment = comment or "malleable:cpus=1"}
   local rec = {job_id = job_id, user_id = user_id, %s}
   print(slurm_job_modify(desc, rec, {}, modify_uid))
end
""" % MALLEABLE + LUA_UPVALUE


def run_lua_full(tmp_path: Path, body: str) -> tuple[list[str], list[str], str]:
    """Runs ``body`` after loading the rendered script; (printed words, event file lines, the
    messages given with slurm.log_user and slurm.log_info)."""
    events = tmp_path / "events"
    script = tmp_path / "job_submit.lua"
    script.write_text(render_job_submit(events, max_cpus=64))
    driver = tmp_path / "driver.lua"
    driver.write_text(f"SCRIPT = {str(script)!r}\n" + PRELUDE + body)
    out = subprocess.run([LUA, str(driver)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = events.read_text().splitlines() if events.exists() else []
    return out.stdout.split(), lines, out.stderr


def run_lua(tmp_path: Path, body: str) -> tuple[list[str], list[str]]:
    """Runs ``body`` after loading the rendered script; (printed words, event file lines)."""
    printed, lines, _ = run_lua_full(tmp_path, body)
    return printed, lines


def test_every_owners_update_wakes_the_watcher_two_in_one_second_included(tmp_path):
    """A resize right after another (same second) must not wait for the watcher's resync: a
    CI run's grow took over 10 s when the hook kept one line per job per second."""
    printed, lines = run_lua(tmp_path, f"""
modify(7, {OWNER}, {OWNER})
modify(7, {OWNER}, {OWNER}, "malleable:cpus=2")     -- the same second: its own line
T = 1001
modify(7, {OWNER}, {OWNER})
""")
    assert printed == ["0", "0", "0"]               # every update accepted (slurm.SUCCESS)
    assert lines == ["1000 update 7", "1000 update 7", "1001 update 7"]


def test_another_users_update_is_left_to_slurm_and_wakes_nothing(tmp_path):
    """The hook does not refuse it either: slurmctld's own check does, right after, with its
    own message ("Invalid user id"), as before."""
    printed, lines = run_lua(tmp_path, f"""
for i = 1, 100 do modify(7, {OWNER}, {STRANGER}) end
modify(8, nil, {STRANGER})       -- a record without its owner: nobody but root wakes
""")
    assert printed == ["0"] * 101 and lines == []


def test_root_wakes_the_watcher_for_any_job(tmp_path):
    _, lines = run_lua(tmp_path, f"modify(9, {OWNER}, 0)\n")
    assert lines == ["1000 update 9"]


def test_lines_per_second_are_capped(tmp_path):
    """A user with thousands of jobs updating them all, second after second: at most RATE_MAX
    lines a second, and every second gets its lines again."""
    printed, lines = run_lua(tmp_path, f"""
for second = 1, 200 do
   T = 1000 + second
   for j = 1, 60 do
      modify(second * 100 + j, {OWNER}, {OWNER})
   end
end
print("rate", upvalue(upvalue(upvalue(slurm_job_modify, "note_event"), "may_note"), "RATE_MAX"))
""")
    rate_max = int(printed[-1])
    assert rate_max < 60 and len(lines) == 200 * rate_max
    per_second: dict[str, int] = {}
    for line in lines:
        per_second[line.split()[0]] = per_second.get(line.split()[0], 0) + 1
    assert set(per_second.values()) == {rate_max} and len(per_second) == 200


def test_refusals_and_the_submit_grammar_are_unchanged(tmp_path):
    printed, lines = run_lua(tmp_path, f"""
modify(7, {OWNER}, {OWNER}, "malleable:cpus=0")          -- out of range: refused
modify(7, {OWNER}, {OWNER}, "malleable:")                -- empty: refused
print(slurm_job_modify({{comment = "malleable:cpus=1"}}, {{job_id = 7, user_id = {OWNER}}}, {{}},
                       {OWNER}))                          -- not malleable: refused
print(slurm_job_modify({{comment = "anything"}}, {{job_id = 7, user_id = {OWNER}}}, {{}}, {STRANGER}))
local d = {{comment = "malleable:min=2,max=node"}}
print(slurm_job_submit(d, {{}}, {OWNER}), d.admin_comment)
print(slurm_job_submit({{comment = "malleable:min=3,max=2"}}, {{}}, {OWNER}))
""")
    assert printed == ["-1", "-1", "-1", "0", "0", "malleable:min=2,max=node,weight=1", "-1"]
    assert lines == []


# --- submit: --malleable (job_desc.spank_job_env) and the older --comment -----------------------

SUBMIT = """
function submit(desc)
   local rc = slurm_job_submit(desc, {}, 1000)
   print(rc, desc.admin_comment or "-")
end
"""
OPTION_GRAMMAR = "--malleable=MIN[:MAX[:WEIGHT]] or off, e.g. --malleable="


def submit_results(tmp_path: Path, calls: str) -> tuple[list[tuple[str, str]], str]:
    printed, lines, messages = run_lua_full(tmp_path, SUBMIT + calls)
    assert lines == []
    return list(zip(printed[::2], printed[1::2])), messages


def test_the_option_is_read_from_spank_job_env_numbered_from_zero(tmp_path):
    """Slurm numbers the entries from 0 (ipairs would miss the first), and slurmctld may
    have prefixed SPANK_ already."""
    results, _ = submit_results(tmp_path, """
submit({spank_job_env = {[0] = "MALLEABLE=2:8:3"}})
submit({spank_job_env = {[0] = "HOME=/x", [1] = "SPANK_MALLEABLE=4"}})
submit({spank_job_env = {[0] = "OTHER=1", [2] = "MALLEABLE=1:node"}})   -- a gap: a NULL entry
submit({spank_job_env = {[0] = "MALLEABLEX=1", [1] = "SPANK_SPANK_MALLEABLE=1"}})
submit({spank_job_env = nil, comment = "just a comment"})
submit({})
""")
    assert results == [("0", "malleable:min=2,max=8,weight=3"),
                       ("0", "malleable:min=4,max=node,weight=1"),
                       ("0", "malleable:min=1,max=node,weight=1"),
                       ("0", "-"), ("0", "-"), ("0", "-")]


def test_off_leaves_the_job_rigid(tmp_path):
    results, messages = submit_results(tmp_path, """
submit({spank_job_env = {[0] = "MALLEABLE=off"}})
submit({spank_job_env = {[0] = "SPANK_MALLEABLE=off"}, comment = "a plain comment"})
""")
    assert results == [("0", "-"), ("0", "-")] and messages == ""


@pytest.mark.parametrize("value", [
    "", "0", "4097", "65", "2:1", "1:2:101", "1:2:3:4", "1::2", ":", "node", "1:node:node",
    "x", "1 ", " 1", "OFF", "off:1", "1:NODE", "00001", "1,2", "-1", "1:0",
])
def test_a_malformed_option_is_refused_naming_the_grammar(tmp_path, value):
    """65: this render's site limit is 64 cores per node."""
    results, messages = submit_results(
        tmp_path, f'submit({{spank_job_env = {{[0] = "MALLEABLE={value}"}}}})\n')
    assert results == [("-1", "-")]
    assert messages.startswith("user: malleable: refused --malleable=")
    assert OPTION_GRAMMAR in messages and "1 to 64" in messages


def test_the_option_given_twice_is_refused(tmp_path):
    """Any client can send any SPANK environment: two answers are no answer."""
    results, messages = submit_results(tmp_path, """
submit({spank_job_env = {[0] = "MALLEABLE=1", [1] = "SPANK_MALLEABLE=2"}})
submit({spank_job_env = {[0] = "MALLEABLE=1", [1] = "MALLEABLE=1"}})
""")
    assert results == [("-1", "-")] * 2
    assert messages.count("--malleable given twice") == 2 and OPTION_GRAMMAR in messages


def test_the_option_and_a_malleable_comment_together_are_refused(tmp_path):
    results, messages = submit_results(tmp_path, """
submit({spank_job_env = {[0] = "MALLEABLE=1:4"}, comment = "malleable:min=1,max=4"})
submit({spank_job_env = {[0] = "MALLEABLE=off"}, comment = "malleable:"})
submit({spank_job_env = {[0] = "MALLEABLE=2"}, comment = "Malleable:min=2"})
submit({spank_job_env = {[0] = "MALLEABLE=2"}, comment = "run 7, malleable:min=2"})
""")
    assert results == [("-1", "-")] * 3 + [("0", "malleable:min=2,max=node,weight=1")]
    assert messages.count("use --malleable only") == 3


@pytest.mark.parametrize("comment", [
    "maleable:min=1", "Malleable:min=1", "MALLEABLE:", "malleable=1", "malleable",
    " malleable:min=1", "\\tmalleable:", "malleabel:max=2", "mallable:", "malleablee:min=2",
    "malleable :min=1", "malleable; min=1", "malleable-test", "Malleable jobs, run 3",
])
def test_a_typo_of_the_prefix_is_refused_not_taken_for_a_rigid_job(tmp_path, comment):
    results, messages = submit_results(tmp_path, f'submit({{comment = "{comment}"}})\n')
    assert results == [("-1", "-")]
    assert "looks like a malleability request" in messages and OPTION_GRAMMAR in messages


@pytest.mark.parametrize("comment", [
    "", "run 7", "mallet: big", "available: yes", "readable:1", "my malleable run", "m:1",
    "malleability study", "1 malleable:min=1",
])
def test_other_comments_leave_the_job_rigid(tmp_path, comment):
    results, messages = submit_results(tmp_path, f'submit({{comment = "{comment}"}})\n')
    assert results == [("0", "-")] and messages == ""


def test_the_older_comment_form_is_still_taken_and_refusals_name_its_grammar(tmp_path):
    results, messages = submit_results(tmp_path, """
submit({comment = "malleable:max=8,weight=2"})
submit({comment = "malleable:min=65"})
""")
    assert results == [("0", "malleable:min=1,max=8,weight=2"), ("-1", "-")]
    assert "malleable: refused 'malleable:min=65': min=65 out of range (1 to 64) (want " \
        "malleable:min=N,max=N|node,weight=N)" in messages


def test_admin_comment_is_only_ever_written_from_the_request(tmp_path):
    """Slurm refuses anyone but an admin an AdminComment before this hook runs (22.05 and
    24.11 job_mgr.c); the hook never takes one as a request: a request overwrites it."""
    results, _ = submit_results(tmp_path, """
submit({comment = "malleable:min=2", admin_comment = "malleable:min=1,max=64,weight=100"})
submit({spank_job_env = {[0] = "MALLEABLE=3:4"},
        admin_comment = "malleable:min=1,max=64,weight=100"})
""")
    assert results == [("0", "malleable:min=2,max=node,weight=1"),
                       ("0", "malleable:min=3,max=4,weight=1")]


def test_an_update_with_a_typo_of_the_prefix_is_refused_and_wakes_nothing(tmp_path):
    printed, lines, messages = run_lua_full(tmp_path, f"""
modify(7, {OWNER}, {OWNER}, "Malleable:cpus=2")
modify(7, {OWNER}, {OWNER}, "maleable:cpus=2")
modify(7, {OWNER}, {OWNER}, "a plain comment")
""")
    assert printed == ["-1", "-1", "0"] and lines == []
    assert messages.count("want malleable:cpus=N and/or min=N,max=N|node") == 2
