"""job_submit.lua, rendered from its template and run by a real Lua interpreter (Debian's
slurmctld embeds Lua 5.1) against a stand-in of slurmctld's ``slurm`` table and job records:
the fields read are the ones Slurm 22.05 and 24.11 expose (job_rec.user_id, .job_id,
.admin_comment; job_desc.comment, .admin_comment). slurmctld calls slurm_job_modify before it
checks who may update the job, so the hook must not wake the watcher for anyone else."""
import shutil
import string
import subprocess
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[2] / "slurm_plugin" / "templates" / \
    "job_submit.lua.tmpl"
LUA = next((p for p in map(shutil.which, ("lua5.1", "lua", "luajit", "lua5.3", "lua5.4")) if p),
           None)


@pytest.fixture(autouse=True)
def lua_interpreter():
    """scripts/setup.sh installs lua5.1: without it this suite fails, it does not skip."""
    assert LUA is not None, "no Lua interpreter: apt-get install lua5.1 (scripts/setup.sh does)"

OWNER, STRANGER = 1000, 1001
MALLEABLE = 'admin_comment = "malleable:min=1,max=node,weight=1"'

PRELUDE = """
slurm = {SUCCESS = 0, ERROR = -1,
         log_user = function(...) io.stderr:write("user: ", string.format(...), "\\n") end,
         log_info = function(...) io.stderr:write("info: ", string.format(...), "\\n") end}
T = 1000
os.time = function() return T end
local rc = dofile(SCRIPT)
assert(rc == slurm.SUCCESS)
function upvalue(f, name)
   for i = 1, 255 do
      local n, v = debug.getupvalue(f, i)
      if n == nil then return nil end
      if n == name then return v end
   end
end
function modify(job_id, user_id, modify_uid, comment)
   local desc = {comment = comment or "malleable:cpus=1"}
   local rec = {job_id = job_id, user_id = user_id, %s}
   print(slurm_job_modify(desc, rec, {}, modify_uid))
end
""" % MALLEABLE


def run_lua(tmp_path: Path, body: str) -> tuple[list[str], list[str]]:
    """Runs ``body`` after loading the rendered script; (printed lines, event file lines)."""
    events = tmp_path / "events"
    script = tmp_path / "job_submit.lua"
    script.write_text(string.Template(TEMPLATE.read_text()).substitute(
        max_value=64, events_file=str(events)))
    driver = tmp_path / "driver.lua"
    driver.write_text(f"SCRIPT = {str(script)!r}\n" + PRELUDE + body)
    out = subprocess.run([LUA, str(driver)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = events.read_text().splitlines() if events.exists() else []
    return out.stdout.split(), lines


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
