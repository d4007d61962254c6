"""Every parser root runs on bytes a job user can influence, fuzzed: for every input it returns,
or raises its own error only, with a short message, in bounded CPU time.

Hypothesis, derandomized (the same inputs on every run, no example database), from raw bytes
and from the real records and captured Slurm output with one part changed to an odd value.
CPU time (``time.thread_time``), not wall time, is bounded: CI machines are shared.
"""
from __future__ import annotations

import copy
import functools
import gc
import json
import re
import signal
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from malleable_protocol import (ProtocolError, RankStatus, ResizeEvent, RunLayout, Target,
                                check_job_id, check_node_name, format_cpu_list, is_reload_signal,
                                parse_cpu_list, step_folder)
from malleable_protocol.cgroupfs import (cpuset_cgroup, parse_cgroup_mount_roots,
                                         parse_mountinfo, parse_proc_cgroup)
from malleable_protocol.layout import check_step_name
from malleable_protocol.records import MAX_RECORD_BYTES, decode_json_bounded
from slurm_plugin.cgroups import CgroupVersion, SlurmCgroupLayout, parse_stepd_title
from slurm_plugin.node.ledger import Allocation, Fence, Ledger, LedgerCorrupt, LedgerFile
from malleable_policy.request import (MalleableSpec, RequestError, parse_submit,
                                              parse_update, spec_and_request)
from slurm_plugin.feed.model import (FeedJob, JobReport, MAX_FEED_BYTES, NodeFeed, NodeReport,
                                     Offers)
from slurm_plugin.slurm.parsers import (SlurmParseError, parse_nodes_json, parse_sbatch_parsable,
                                        parse_scontrol_ping, parse_slurm_version,
                                        parse_squeue_json)

FIX = Path(__file__).parent.parent / "fixtures"
FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=200,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example])
# CPU bounds, in units of a yardstick measured on this machine when the test runs
# (``reference_cpu_s``), so they hold on a slow or busy machine as on a fast one: per call on
# inputs of the size a job user controls, and for root's node feed at its size bound (1 MiB).
CPU_BOUND = 1.0
FEED_CPU_BOUND = 12.0
MAX_MESSAGE = 300         # an error never carries the input whole


def timed(fn: Callable[..., Any], *args: Any, refuses: type[Exception] | tuple = ()
          ) -> tuple[Any, float]:
    """``fn(*args)`` or the error of ``refuses`` it raised, and the CPU time it took. The
    garbage collector waits: a collection of the whole test process is not the parser's cost."""
    gc.disable()
    t0 = time.thread_time()
    try:
        out = fn(*args)
    except refuses as exc:
        out = exc
    finally:
        spent = time.thread_time() - t0
        gc.enable()
    return out, spent


def reference_cpu_s() -> float:
    """The yardstick of the CPU bounds: the CPU time, here and now, of encoding the largest
    valid node feed (the watcher's own work at each poll: json and Python objects, as in every
    parser here); the least of five runs."""
    feed = _yardstick_feed()
    return min(timed(feed.encode)[1] for _ in range(5))


@functools.cache
def _yardstick_feed() -> NodeFeed:
    return NodeFeed.decode(_full_feed())


_reference_once = functools.cache(reference_cpu_s)     # for the many calls of the fuzz tests


def call(fn: Callable[..., Any], *args: Any, refuses: type[Exception] | tuple = (),
         bound: float = CPU_BOUND) -> Any:
    """``fn(*args)``, or the error of ``refuses`` it raised; anything else fails the test, as
    does more than ``bound`` yardsticks of CPU or a long message."""
    out, spent = timed(fn, *args, refuses=refuses)
    yardstick = _reference_once()
    assert spent < bound * yardstick, \
        f"{fn.__qualname__}: {spent * 1000:.0f} ms CPU (a yardstick: {yardstick * 1000:.1f} ms)"
    if isinstance(out, Exception):
        assert len(str(out)) <= MAX_MESSAGE, f"{fn.__qualname__}: {len(str(out))}-char message"
    return out


# --- odd values, and records with one part changed to one ------------------------------------

_NEST = re.compile(r'"\\u0000nest(\d+)"')


def dumps(doc: Any, ascii_only: bool = True) -> str:
    """JSON text of ``doc`` (NaN and Infinity as JSON's literals), each "\\0nest<n>" string
    replaced with arrays nested ``n`` deep (json.dumps itself would recurse too deep)."""
    text = json.dumps(doc, ensure_ascii=ascii_only)
    return _NEST.sub(lambda m: "[" * int(m[1]) + "]" * int(m[1]), text)


ODD_TEXT = st.sampled_from(["", "²", "٣", "１２", "0-65535", "0-65535," * 512, "x" * 5000,
                            "..", "/", "a/../b", "n1", "step_batch", "malleable:min=1",
                            "malleable:cpus=2\n", "Infinity", "1e999", "\x00", "\ud800",
                            "9" * 5000, " 7 ", "0x10", "-1", "\u2200"])   # U+2200: 00 22 in UTF-16
ODD_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=40), ODD_TEXT,
    st.sampled_from([-1, 0, 1, 2**31, 2**32, 2**62, 2**63, 2**64, 10**400, -10**400,
                     float("nan"), float("inf"), -0.0, 1e308]),
    st.integers(1, 3000).map(lambda n: f"\x00nest{n}"))
ODD_VALUES = st.recursive(
    ODD_SCALARS, lambda inner: st.lists(inner, max_size=3) |
    st.dictionaries(st.text(max_size=8) | ODD_TEXT, inner, max_size=3), max_leaves=8)


@st.composite
def mutated(draw: st.DrawFn, seeds: list[Any]) -> Any:
    """A copy of one of ``seeds`` with one value somewhere in it replaced, removed, or added."""
    doc = copy.deepcopy(draw(st.sampled_from(seeds)))
    node = doc
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = draw(st.sampled_from(keys))
        child = node[key]
        if not (isinstance(child, (dict, list)) and child and draw(st.integers(0, 3))):
            break
        node = child
    action = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
    if not keys or action == "add":
        if isinstance(node, dict):
            node[draw(st.text(max_size=12) | ODD_TEXT)] = draw(ODD_VALUES)
        else:
            node.append(draw(ODD_VALUES))
    elif action == "remove":
        del node[key]
    else:
        node[key] = draw(ODD_VALUES)
    return doc


ENCODINGS = st.sampled_from(["utf-8"] * 6 + ["utf-16-le", "utf-16", "utf-32"])
JSONISH = st.text(alphabet='[]{}",:0123456789-.eE +\\ntrufalsNIiy²\u2200\u5b5b', max_size=300)


# Characters with a JSON quote, backslash or bracket among their UTF-16/32 bytes, beside deep
# nesting: what a scanner of bytes (the depth check) may take for structure.
LOOKALIKES = [chr(b << 8) for b in b'"\\[]{}'] + [chr(0x4100 | b) for b in b'"\\[]{}']
HIDDEN = st.builds(
    lambda s, n, enc: ('{"s": "%s", "n": %s, "t": ""}' % (s, "[" * n + "]" * n)).encode(enc),
    st.text(alphabet=LOOKALIKES, min_size=1, max_size=4), st.integers(1000, 3000),
    st.sampled_from(["utf-16-le", "utf-16-be", "utf-32-le"]))


@st.composite
def json_bytes(draw: st.DrawFn, seeds: list[Any]) -> bytes:
    """Bytes a reader of ``seeds``' records may be given: a changed record or JSON-like text,
    in UTF-8 mostly, sometimes UTF-16/32 (which json.loads also takes), or random bytes."""
    text = draw(st.one_of(st.builds(dumps, mutated(seeds), st.booleans()), JSONISH))
    return draw(st.one_of(ENCODINGS.map(lambda enc: text.encode(enc, "surrogatepass")),
                          HIDDEN, st.binary(max_size=512)))


# --- malleable_protocol.records ----------------------------------------------------------------

GOOD_STATUS = RankStatus(pid=10, rank=3, local_rank=1, local_size=2, intra_active=2,
                         intra_pool=4, inter_active=1, inter_pool=2, node="n1",
                         allowed_cpus=frozenset({0, 1, 2, 3}), share_cpus=frozenset({2, 3}),
                         steps_per_s={1: 2.5, 2: 4.0}, steps=12, resizes=1,
                         last_resize=ResizeEvent(10.0, 1, 2, 1, 1, "grow", 3.5), updated=11.0,
                         reload_signal=signal.SIGRTMIN + 3)
STATUS_SEEDS = [json.loads(GOOD_STATUS.encode()),
                json.loads(RankStatus(pid=1, rank=0, local_rank=0, local_size=1, intra_active=1,
                                      intra_pool=1, inter_active=1, inter_pool=1).encode())]
TARGET_SEEDS = [json.loads(Target(frozenset({0, 1, 5}), generation=7).encode())]
# UTF-16: U+2200's bytes (00 22) hold a quote, so the byte-level depth check paired the quotes
# wrongly and skipped the real brackets; json.loads then recursed to a RecursionError.
UTF16_DEEP = ('{"a": "\u2200", "b": ' + "[" * 3000 + "]" * 3000 + ', "c": "x"}'
              ).encode("utf-16-le")


@pytest.mark.parametrize("decode", [RankStatus.decode, Target.decode, decode_json_bounded])
@FUZZ
@given(raw=json_bytes(STATUS_SEEDS + TARGET_SEEDS))
@example(raw=UTF16_DEEP)
def test_records_refuse_with_a_protocol_error_only(decode, raw):
    out = call(decode, raw, refuses=ProtocolError)
    if isinstance(out, RankStatus):    # root signals a rank with it: one of the few it may send
        assert out.reload_signal is None or is_reload_signal(out.reload_signal)


# What a record may name as its reload signal, and numbers near them.
SIGNAL_NUMBERS = st.one_of(st.integers(-2, 70), st.sampled_from(
    [signal.SIGRTMIN - 1, signal.SIGRTMAX + 1, 2**31, 2**63, -2**63, 10**400]))


@FUZZ
@given(value=ODD_VALUES | SIGNAL_NUMBERS)
@example(value=signal.SIGKILL)
@example(value=10.0)
def test_a_records_reload_signal_is_usr1_usr2_or_real_time_or_refused(value):
    raw = dumps({**STATUS_SEEDS[0], "reload_signal": value}).encode("utf-8", "surrogatepass")
    out = call(RankStatus.decode, raw, refuses=ProtocolError)
    allowed = value is None or (type(value) is int and (
        value in (signal.SIGUSR1, signal.SIGUSR2) or signal.SIGRTMIN <= value <= signal.SIGRTMAX))
    assert isinstance(out, ProtocolError) != allowed, (value, out)
    if allowed:
        assert out.reload_signal == value


def test_utf16_record_with_a_quote_byte_inside_a_character_is_refused():
    with pytest.raises(ProtocolError):
        RankStatus.decode(UTF16_DEEP)


cpu_sets = st.frozensets(st.integers(0, 65535), max_size=64) | \
    st.frozensets(st.integers(0, 127), max_size=128)
rates = st.integers(0, 10**13 - 1).map(lambda x: x / 10**4)   # 4 decimals: encode rounds to 4


@st.composite
def rank_statuses(draw: st.DrawFn) -> RankStatus:
    local_size = draw(st.integers(1, 4096))
    threads = st.integers(1, 4096)
    event = draw(st.none() | st.builds(
        ResizeEvent, time=st.floats(0, 1e12), intra_before=threads, intra_after=threads,
        inter_before=threads, inter_after=threads, reason=st.text(max_size=64),
        latency_ms=st.floats(0, 1e9)))
    return RankStatus(
        pid=draw(st.integers(1, 2**22)), rank=draw(st.integers(0, 2**24)),
        local_rank=draw(st.integers(0, local_size - 1)), local_size=local_size,
        intra_active=draw(threads), intra_pool=draw(threads), inter_active=draw(threads),
        inter_pool=draw(threads), node=draw(st.text(max_size=64)),
        allowed_cpus=draw(cpu_sets), share_cpus=draw(cpu_sets),
        steps_per_s=draw(st.dictionaries(st.integers(0, 9999), rates, max_size=32)),
        steps=draw(st.integers(0, 2**62)), resizes=draw(st.integers(0, 2**62)),
        last_resize=event, updated=draw(st.floats(0, 1e12)),
        reload_signal=draw(st.none() | st.sampled_from([signal.SIGUSR1, signal.SIGUSR2]) |
                           st.integers(signal.SIGRTMIN, signal.SIGRTMAX)))


@FUZZ
@given(status=rank_statuses())
def test_status_records_round_trip(status):
    assert RankStatus.decode(status.encode()) == status


@FUZZ
@given(cpus=cpu_sets.filter(bool), generation=st.integers(0, 2**62))
def test_targets_round_trip(cpus, generation):
    target = Target(cpus, generation)
    assert Target.decode(target.encode()) == target


# --- malleable_protocol.cpulist ----------------------------------------------------------------

CPU_ALPHABET = "0123456789-, \t\n²٣"
cpu_texts = st.one_of(
    st.text(alphabet=CPU_ALPHABET, max_size=200),
    st.lists(st.tuples(st.integers(0, 70000), st.integers(0, 70000)), max_size=50).map(
        lambda rs: ",".join(f"{a}-{b}" if a != b else str(a) for a, b in rs)),
    # One pattern repeated up to the 64 KiB a cpuset file read holds.
    st.tuples(st.text(alphabet=CPU_ALPHABET, min_size=1, max_size=16),
              st.integers(1, 65536)).map(lambda t: (t[0] * (t[1] // len(t[0]) + 1))[:t[1]]))


@FUZZ
@given(text=cpu_texts)
@example(text="0-65535," * 8192)
def test_cpu_lists_refuse_with_a_value_error_only(text):
    cpus = call(parse_cpu_list, text, refuses=ValueError)
    if not isinstance(cpus, ValueError):
        assert all(0 <= c < 65536 for c in cpus)
        assert parse_cpu_list(format_cpu_list(cpus)) == cpus


@FUZZ
@given(cpus=st.frozensets(st.integers(0, 65535), max_size=300))
def test_cpu_lists_round_trip(cpus):
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


# --- malleable_protocol.layout -----------------------------------------------------------------

NAME_PARTS = st.sampled_from(["rank_", "rank_3", "rank_²", "rank_٣", "rank_0", ".", "step_",
                              "step_0", "step_batch", "step_٣", ".json", "\n", "0", "9" * 12])
names = st.one_of(st.text(max_size=60), st.lists(NAME_PARTS, max_size=5).map("".join))
anything = st.one_of(ODD_VALUES, names)


@FUZZ
@given(name=names)
@example(name="rank_٣.json")
def test_status_file_names(name):
    rank = call(RunLayout.parse_status_name, name)
    assert rank is None or (name.isascii() and 0 <= rank < 10**9)


@FUZZ
@given(step_id=st.none() | names)
@example(step_id="٣")
def test_step_ids(step_id):
    folder = call(step_folder, step_id, refuses=ValueError)
    if not isinstance(folder, ValueError):
        assert check_step_name(folder) == folder and folder.isascii()


@pytest.mark.parametrize("check", [check_step_name, check_node_name, check_job_id])
@FUZZ
@given(value=anything)
@example(value="step_٣")
def test_name_and_id_checks_refuse_with_a_value_error_only(check, value):
    out = call(check, value, refuses=ValueError)
    assert isinstance(out, ValueError) or out == value
    if isinstance(out, str):
        assert out.isascii()


# --- malleable_protocol.cgroupfs and slurm_plugin.cgroups --------------------------------------

def _fixture_lines(*names: str) -> list[str]:
    return [line for name in names for line in (FIX / name).read_text().splitlines()]


CGROUP_LINES = _fixture_lines("slurm-22.05-production/proc_task_cgroup.txt",
                              "slurm-24.11-cgroup-v2/proc_cgroup_slurmstepd.txt")
MOUNT_LINES = _fixture_lines("host-cgroup-v1/mountinfo.txt", "docker_container_cgroup.txt")


def _spliced(lines: list[str]) -> st.SearchStrategy[str]:
    """Text made of real lines, random ones, and real lines with random text put in them."""
    line = st.one_of(
        st.sampled_from(lines), st.text(max_size=80),
        st.tuples(st.sampled_from(lines), st.integers(0, 200),
                  st.text(alphabet=":,/- \t\\", max_size=8) | st.text(max_size=8)).map(
            lambda t: t[0][:t[1]] + t[2] + t[0][t[1]:]))
    return st.lists(line, max_size=20).map("\n".join)


@FUZZ
@given(text=_spliced(CGROUP_LINES))
def test_proc_cgroup_parsers_never_raise(text):
    groups = call(parse_proc_cgroup, text)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in groups.items())
    assert call(cpuset_cgroup, text) in (None, *groups.values())


@FUZZ
@given(text=_spliced(MOUNT_LINES))
def test_mountinfo_parsers_never_raise(text):
    assert all(isinstance(m.point, str) for m in call(parse_mountinfo, text))
    roots = call(parse_cgroup_mount_roots, text, Path("/sys/fs/cgroup"))
    assert all(isinstance(v, str) for v in roots.values())


TITLE_PARTS = st.sampled_from([b"slurmstepd", b": ", b"[", b"]", b".", b"batch", b"5", b"0",
                               b"\0", "²".encode(), "٣".encode(), b"\xff", b"4294967296",
                               b"9" * 40, b" "])


@FUZZ
@given(cmdline=st.binary(max_size=256) | st.lists(TITLE_PARTS, max_size=12).map(b"".join))
@example(cmdline="slurmstepd: [²]".encode())
def test_stepd_titles(cmdline):
    job = call(parse_stepd_title, cmdline[:256])
    assert job is None or (0 < job < 2**32 and str(job).encode() in cmdline)


def test_stepd_title_with_a_unicode_digit_is_none():
    """"²".isdigit() is True but int("²") raises: the title of any process named slurmstepd
    (a user can name one so) stopped the scan with a bare ValueError."""
    assert parse_stepd_title("slurmstepd: [²]".encode()) is None
    assert parse_stepd_title(b"slurmstepd: [5.batch]\0") == 5


LAYOUTS = [SlurmCgroupLayout.named("n1", v, multiple_slurmd=m)
           for v in CgroupVersion for m in (True, False)]
SEGMENTS = st.one_of(st.text(max_size=10), st.sampled_from(
    ["", ".", "..", "slurm", "slurm_n1", "slurm_n2", "uid_0", "uid_²", "job_5", "job_0005",
     "job_²", "job_٣", "job_" + "9" * 5000, "step_0", "step_batch", "step_²", "task_0",
     "task_special", "user", "system.slice", "n1_slurmstepd.scope", "n2_slurmstepd.scope",
     "slurmstepd.scope"]))
cgroup_paths = st.lists(SEGMENTS, max_size=8).map(lambda s: "/" + "/".join(s)) | st.text()


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda c: c.root)
@FUZZ
@given(path=cgroup_paths, job_id=st.sampled_from([5, 1, 2**32 - 1]), name=SEGMENTS)
@example(path="/slurm_n1/uid_0/job_²", job_id=5, name="")
@example(path="/system.slice/n1_slurmstepd.scope/job_" + "9" * 5000, job_id=5, name="")
def test_cgroup_path_readers_never_raise(layout, path, job_id, name):
    """The paths /proc/<pid>/cgroup names: on v1 the job's user owns its step folders and makes
    folders of any name below them."""
    job = call(layout.job_of, path)
    assert job is None or any(s[:4] == "job_" and s[4:].isascii() and s[4:].isdigit() and
                              int(s[4:]) == job for s in path.split("/"))
    step = call(layout.step_of, path, job_id)
    assert step is None or check_step_name(step) == step
    assert call(layout.another_nodes, path) in (True, False)
    assert call(layout.misplaced, path, job_id) in (True, False)
    assert call(layout.slurm_child, path, name) in (True, False)


def test_job_folder_names_are_ascii_digits():
    """"job_²" passed isdigit() and int() raised: the reader of a path raised ValueError."""
    v1 = SlurmCgroupLayout.named("n1", CgroupVersion.V1, multiple_slurmd=True)
    assert v1.job_of("/slurm_n1/uid_0/job_²/step_0") is None
    assert v1.job_of("/slurm_n1/uid_0/job_" + "9" * 5000) is None     # int() of 5000 digits
    assert v1.job_of("/slurm_n1/uid_0/job_7/step_0") == 7


# --- malleable_policy.request ----------------------------------------------------------

ITEM_PARTS = st.sampled_from(["min", "max", "weight", "cpus", "node", "=", ",", "0", "1", "4",
                              "100", "4096", "4097", "9999", "00001", "²", "٣", " ", "\n", "x"])
comments = st.one_of(
    st.text(max_size=60), st.lists(ITEM_PARTS, max_size=14).map("".join),
    st.lists(ITEM_PARTS, max_size=14).map(lambda p: "malleable:" + "".join(p)),
    st.lists(st.tuples(st.sampled_from(["min", "max", "weight", "cpus"]),
                       st.integers(0, 5000).map(str) | ITEM_PARTS), max_size=4).map(
        lambda items: "malleable:" + ",".join(f"{k}={v}" for k, v in items)))
GRAMMAR = re.compile(r"malleable:(?:[a-z]+=[0-9a-z]+(?:,[a-z]+=[0-9a-z]+)*)?")


@FUZZ
@given(text=comments)
@example(text="malleable:min=2\n")
def test_submit_requests(text):
    spec = call(parse_submit, text, refuses=RequestError)
    if not isinstance(spec, RequestError):
        assert GRAMMAR.fullmatch(text)
        assert 1 <= spec.min_cpus <= 4096 and 1 <= spec.weight <= 100
        assert spec.max_cpus is None or spec.min_cpus <= spec.max_cpus <= 4096
        assert parse_submit(spec.normal_form()) == spec


@FUZZ
@given(text=comments)
@example(text="malleable:cpus=3\n")
def test_update_requests(text):
    up = call(parse_update, text, refuses=RequestError)
    if not isinstance(up, RequestError):
        assert GRAMMAR.fullmatch(text)


@FUZZ
@given(admin=comments, comment=comments)
def test_spec_and_request_never_raises(admin, comment):
    spec, requested = call(spec_and_request, admin, comment)
    assert spec is None or isinstance(spec, MalleableSpec)
    assert requested is None or 1 <= requested <= 4096


def test_a_newline_after_the_last_item_is_refused():
    """"$" matches before a final newline: "malleable:cpus=3\\n" was taken for cpus=3."""
    with pytest.raises(RequestError):
        parse_update("malleable:cpus=3\n")
    with pytest.raises(RequestError):
        parse_submit("malleable:min=1,max=2\n")


# --- slurm_plugin.feed.model -------------------------------------------------------------------

FEED_JOB = FeedJob(job_id=7, uid=1000, user="alice", allocation=frozenset({0, 1, 4}),
                   nodes=("n1", "n2"), spec=MalleableSpec(1, 8, 2), requested=3)
FEED_SEEDS = [json.loads(NodeFeed("n1", 8, (FEED_JOB,), updated=5.0).encode())]
OFFER_SEEDS = [json.loads(Offers("n1", {7: 2, 9: 1}).encode())]
REPORT_SEEDS = [json.loads(NodeReport("n1", (JobReport(7, frozenset({0, 1}), (2, 2), (1.5, 2.0)),),
                                      ("a problem",)).encode())]


@pytest.mark.parametrize("decode,seeds", [(NodeFeed.decode, FEED_SEEDS),
                                          (Offers.decode, OFFER_SEEDS),
                                          (NodeReport.decode, REPORT_SEEDS)],
                         ids=["feed", "offers", "report"])
@FUZZ
@given(data=st.data())
def test_feed_files_refuse_with_a_protocol_error_only(decode, seeds, data):
    call(decode, data.draw(json_bytes(seeds)), refuses=ProtocolError)


@FUZZ
@given(job=mutated([FEED_SEEDS[0]["jobs"][0]]).filter(lambda d: isinstance(d, dict)))
def test_feed_jobs_refuse_with_a_protocol_error_only(job):
    call(FeedJob.from_dict, job, refuses=ProtocolError)


@pytest.mark.parametrize("decode,raw", [
    (NodeReport.decode, UTF16_DEEP),
    (Offers.decode, b'{"node": "n1", "per_rank": {"\xc2\xb2": 1}}'),     # "²".isdigit()
    (Offers.decode, b'{"node": "n1", "per_rank": {"' + b"9" * 5000 + b'": 1}}'),
    (Offers.decode, b'{"node": "../x", "per_rank": {}}'),                 # check_node_name's
    (NodeFeed.decode, b'{"node": "n1", "cpus": 1, "jobs": [], "updated": 1' + b"0" * 400 + b"}"),
    (NodeFeed.decode, b'{"node": "' + b"/" * 5000 + b'", "cpus": 1, "jobs": []}'),
    (NodeReport.decode, b'{"node": "n1", "jobs": [{"job_id": 1, "current": "0", '
                        b'"threads": [Infinity], "steps_per_s": []}]}'),
])
def test_feed_files_that_raised_other_errors(decode, raw):
    """Each raised RecursionError, ValueError or OverflowError, not ProtocolError (the readers
    catch only it)."""
    with pytest.raises(ProtocolError) as refused:
        decode(raw)
    assert len(str(refused.value)) <= MAX_MESSAGE


# --- slurm_plugin.node.ledger -----------------------------------------------------------

LEDGER_SEEDS = [json.loads(Ledger(
    allocations={5: Allocation(1000, frozenset({0, 1}))}, starting={6: 1.0}, ended={4: 2.0},
    fences={(5, "step_0"): Fence("step_0", 77, 3.0)}).encode())]


@pytest.fixture(scope="module")
def ledger_file(tmp_path_factory) -> LedgerFile:
    return LedgerFile(tmp_path_factory.mktemp("state"), "n1")


@FUZZ
@given(raw=json_bytes(LEDGER_SEEDS))
@example(raw=b'{"allocations": [1]}')
@example(raw=b'{"starting": {"5": 1' + b"0" * 400 + b"}}")
def test_ledger_decode_refuses_with_a_protocol_error_only(ledger_file, raw):
    call(Ledger.decode, raw, refuses=ProtocolError)
    (ledger_file.folder / ledger_file.name).write_bytes(raw)
    try:
        assert isinstance(ledger_file.load(), Ledger)
    except LedgerCorrupt:       # refused: kept aside whole
        assert ledger_file.kept_aside.read_bytes() == raw
        ledger_file.kept_aside.unlink()


def test_ledger_of_wrong_shapes_is_kept_aside(ledger_file):
    """A list where a map belongs (AttributeError) or a 400-digit time (OverflowError) got
    past LedgerFile.load, which catches ValueError, KeyError and TypeError: each is a
    ProtocolError now, so the ledger is kept aside and the load refused."""
    for raw in (b'{"allocations": [1]}', b'{"ended": {"5": 1' + b"0" * 400 + b"}}",
                b'{"allocations": {"5": {"uid": 1, "cpus": 3}}}'):
        with pytest.raises(ProtocolError):
            Ledger.decode(raw)
        (ledger_file.folder / ledger_file.name).write_bytes(raw)
        with pytest.raises(LedgerCorrupt):
            ledger_file.load()
        ledger_file.kept_aside.unlink()
    assert ledger_file.load() == Ledger()


# --- slurm_plugin.slurm.parsers ----------------------------------------------------------------

def _json_fixtures(*names: str) -> list[Any]:
    return [json.loads((FIX / name).read_text()) for name in names]


SQUEUE_SEEDS = _json_fixtures("slurm-22.05/squeue.json", "slurm-22.05/squeue_hostile.json",
                              "slurm-22.05/squeue_mixed.json", "slurm-24.11/squeue.json",
                              "slurm-24.11/squeue_one.json")
NODES_SEEDS = _json_fixtures("slurm-22.05/sinfo.json", "slurm-22.05/sinfo_hostile.json",
                             "slurm-24.11/scontrol_show_nodes.json")
# Fields of a job record its user sets (sbatch --job-name, --comment, the script, -o, -D).
USER_FIELDS = ["name", "comment", "command", "standard_output", "standard_error",
               "current_working_directory"]


@pytest.mark.parametrize("parse,seeds", [(parse_squeue_json, SQUEUE_SEEDS),
                                         (parse_nodes_json, NODES_SEEDS)],
                         ids=["squeue", "nodes"])
@FUZZ
@given(data=st.data())
def test_slurm_json_refuses_with_a_parse_error_only(parse, seeds, data):
    text = data.draw(st.one_of(st.builds(dumps, mutated(seeds), st.booleans()), JSONISH,
                               st.integers(1, 3000).map(lambda n: "[" * n)))
    call(parse, text, refuses=SlurmParseError)


@FUZZ
@given(seed=st.sampled_from(SQUEUE_SEEDS), field=st.sampled_from(USER_FIELDS),
       value=st.text() | ODD_TEXT, index=st.integers(0), ascii_only=st.booleans())
def test_user_text_in_squeue_never_fails_the_parse(seed, field, value, index, ascii_only):
    """A user's own text fails nobody's poll: whatever the job's name or comment, every job
    parses and keeps it whole."""
    doc = copy.deepcopy(seed)
    job = doc["jobs"][index % len(doc["jobs"])]
    job[field] = value
    text = json.dumps(doc, ensure_ascii=ascii_only)
    parsed = {j.job_id: j for j in call(parse_squeue_json, text)}
    assert len(parsed) == len(doc["jobs"])
    if field in ("name", "comment"):
        assert getattr(parsed[job["job_id"]], field) == value


@pytest.mark.parametrize("parse,raw", [
    (parse_squeue_json, '{"jobs": [{"job_id": 1, "job_resources": [1]}]}'),   # .get of a list
    (parse_squeue_json, '{"jobs": [{"job_id": Infinity}]}'),                  # int(inf)
    (parse_nodes_json, '{"nodes": [{"name": "n1", "cpus": {"set": true, "number": -Infinity}}]}'),
    (parse_squeue_json, '{"jobs": [{"job_id": 1, "job_resources": '
                        '{"nodes": {"allocation": [7]}}}]}'),
    (parse_squeue_json, "[" * 100000),                                        # RecursionError
    (parse_nodes_json, '{"nodes": [1' + "0" * 5000 + "]}"),                   # over 4300 digits
])
def test_slurm_json_that_raised_other_errors(parse, raw):
    with pytest.raises(SlurmParseError) as refused:
        parse(raw)
    assert len(str(refused.value)) <= MAX_MESSAGE


def test_squeue_node_lists_expand_in_bounded_cost():
    doc = copy.deepcopy(SQUEUE_SEEDS[0])
    doc["jobs"][0]["nodes"] = "n" + "[1]" * 2000
    call(parse_squeue_json, json.dumps(doc), refuses=SlurmParseError)
    doc["jobs"][0]["nodes"] = "n" + "[1-2]" * 30          # 2**30 names: refused, not expanded
    assert isinstance(call(parse_squeue_json, json.dumps(doc), refuses=SlurmParseError),
                      SlurmParseError)


SMALL_OUTPUTS = st.one_of(
    _spliced(_fixture_lines("slurm-22.05/scontrol_ping.txt", "slurm-24.11/scontrol_ping.txt",
                            "slurm-22.05-production/slurmd_V.txt") + ["slurm 24.11.5", "42;c1"]),
    st.binary(max_size=80).map(lambda b: b.decode("utf-8", "replace")),
    st.lists(st.sampled_from(["slurm", " ", "22", ".", "05", "²", "٣", "9" * 5000, ";", "c1",
                              "\n", "is UP", "is DOWN"]), max_size=8).map("".join))


@FUZZ
@given(text=SMALL_OUTPUTS)
@example(text="²")
@example(text="9" * 5000 + ".1")
def test_small_slurm_outputs(text):
    job = call(parse_sbatch_parsable, text, refuses=SlurmParseError)
    assert isinstance(job, SlurmParseError) or 0 <= job < 10**10
    version = call(parse_slurm_version, text, refuses=SlurmParseError)
    assert isinstance(version, SlurmParseError) or all(0 <= v < 10**9 for v in version)
    assert call(parse_scontrol_ping, text) in (True, False)


# --- the worst inputs of each size bound, timed ------------------------------------------------

def _status_with(**fields: Any) -> bytes:
    return json.dumps({**STATUS_SEEDS[0], **fields}).encode()


def _full_feed() -> bytes:
    """A valid feed of as many jobs as fit in its size bound."""
    def feed(count: int) -> bytes:
        return NodeFeed("n1", 64, tuple(
            FeedJob(job_id=i, uid=1000, user="u" * 64, allocation=frozenset(range(0, 64, 2)),
                    nodes=("n1", "n2"), spec=MalleableSpec(1, 8, 1), requested=3)
            for i in range(1, count + 1))).encode()
    raw = feed(4096 * MAX_FEED_BYTES // len(feed(4096)) - 16)
    assert len(raw) <= MAX_FEED_BYTES
    return raw


LIST_64K = ",".join(map(str, range(65536)))[:65536].rstrip(",")
WORST = [
    # (parser, input, its own error, CPU bound in yardsticks): records are at most 16 KiB,
    # CPU lists 64 KiB (a cpuset read); the feed files (root's, 1 MiB at most) get a bound for
    # their size.
    (RankStatus.decode, b"[" * MAX_RECORD_BYTES, ProtocolError, CPU_BOUND),
    (RankStatus.decode, b"[]" * (MAX_RECORD_BYTES // 2), ProtocolError, CPU_BOUND),
    (RankStatus.decode, b'"' + b'\\"' * (MAX_RECORD_BYTES // 2 - 1) + b'"', ProtocolError,
     CPU_BOUND),
    (RankStatus.decode, b"1" * MAX_RECORD_BYTES, ProtocolError, CPU_BOUND),
    (RankStatus.decode, _status_with(allowed_cpus="0-65535", share_cpus="0-65535"),
     ProtocolError, CPU_BOUND),
    (RankStatus.decode, _status_with(share_cpus=LIST_64K[:4096].rstrip(",")), ProtocolError,
     CPU_BOUND),
    (RankStatus.decode, _status_with(steps_per_s={str(i): 1.5 for i in range(256)}),
     ProtocolError, CPU_BOUND),
    (parse_cpu_list, LIST_64K, ValueError, CPU_BOUND),
    (parse_cpu_list, ",".join(f"{2 * i}-{2 * i + 1}" for i in range(7000))[:65536],
     ValueError, CPU_BOUND),
    (parse_cpu_list, ("0-65535," * 8192)[:65536], ValueError, CPU_BOUND),
    (parse_cpu_list, " ," * 32768, ValueError, CPU_BOUND),
    (parse_proc_cgroup, "0:" + "," * 65536 + ":/", (), CPU_BOUND),
    (parse_proc_cgroup, "\n" * 65536, (), CPU_BOUND),
    (parse_stepd_title, b"slurmstepd: [" + b"9" * 243, (), CPU_BOUND),
    (parse_update, "malleable:" + "cpus=1," * 9000, RequestError, CPU_BOUND),
    (parse_squeue_json, json.dumps(SQUEUE_SEEDS[2]), SlurmParseError, CPU_BOUND),
    (NodeFeed.decode, b"[]" * (MAX_FEED_BYTES // 2), ProtocolError, FEED_CPU_BOUND),
    (NodeFeed.decode, _full_feed(), ProtocolError, FEED_CPU_BOUND),
]


# Shapes that made a regex rescan the rest of the record at each quote (1.0 s of root CPU at
# 16 KiB before strings were matched to the end): unterminated strings of escaped quotes, lone
# backslashes, quotes among brackets; each at every size up to the record bound.
RECORD_SHAPES = {
    "escaped quotes, unterminated": lambda n: b'"' + b'\\"' * (n // 2 - 1),
    "escaped quotes, a backslash last": lambda n: b'"' + b'\\"' * (n // 2 - 2) + b"\\",
    "quote backslash": lambda n: b'"\\' * (n // 2),
    "backslashes": lambda n: b"\\" * n,
    "quotes": lambda n: b'"' * n,
    "bracket quote": lambda n: b'["' * (n // 2),
    "brace quote": lambda n: b'{"' * (n // 2),
    "bracket escaped quote": lambda n: b'["\\"' * (n // 4),
    "object of escaped quotes": lambda n: b'{"a":"' + b'\\"' * (n // 2 - 4),
}
RECORD_SIZES = [2 ** k for k in range(6, 15)] + [MAX_RECORD_BYTES]


@pytest.mark.parametrize("shape", RECORD_SHAPES)
@pytest.mark.parametrize("decode", [RankStatus.decode, Target.decode])
def test_record_shapes_at_every_size_stay_in_their_cpu_bound(decode, shape):
    yardstick = reference_cpu_s()
    for size in RECORD_SIZES:
        raw = RECORD_SHAPES[shape](size)[:MAX_RECORD_BYTES]
        best = min(timed(decode, raw, refuses=ProtocolError)[1] for _ in range(3))
        assert best < CPU_BOUND * yardstick, \
            f"{size} bytes: {best * 1000:.1f} ms CPU ({yardstick * 1000:.1f} ms a yardstick)"


@pytest.mark.parametrize("parse,raw,refuses,bound", WORST,
                         ids=[f"{w[0].__qualname__}-{i}" for i, w in enumerate(WORST)])
def test_worst_inputs_stay_in_their_cpu_bound(parse, raw, refuses, bound):
    best = min(timed(parse, raw, refuses=refuses)[1] for _ in range(3))   # noise only adds
    yardstick = reference_cpu_s()       # measured beside it
    assert best < bound * yardstick, \
        f"{best * 1000:.1f} ms CPU: {best / yardstick:.2f} yardsticks of {yardstick * 1000:.1f} ms"
