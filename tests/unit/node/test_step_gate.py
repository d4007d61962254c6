"""The step start's fast path (step_gate) and the agent's step-start socket (step_socket):
which jobs get a gate, the fence files the SPANK plugin writes and the next cycle takes in,
and the socket's one-line protocol with a real Unix socket and a real peer check."""
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malleable_policy.model import Outcome, OutcomeStatus
from malleable_policy.model import Action, ActionKind, JobView, NodeSnapshot, Reason
from malleable_policy.request import MalleableSpec
from slurm_plugin.node.safety import Verdict
from slurm_plugin.node.step_gate import StepGate, gated_jobs
from slurm_plugin.daemon.step_socket import (StepStartRequest, StepStartServer,
                                                   encode_answer)

S = frozenset


def job(jid, alloc, current, **kw):
    return JobView(job_id=jid, uid=1000, user="u", allocation=S(alloc), current=S(current),
                   spec=MalleableSpec(1, None), **kw)


def snap(*jobs, pending=()):
    return NodeSnapshot(node="n1", cpus=S(range(8)), jobs=tuple(jobs), pending_starts=pending)


def outcome(j, after, status=OutcomeStatus.APPLIED):
    a = Action(ActionKind.SHRINK, j.job_id, j.uid, j.allocation, j.current, S(after), (1,),
               Reason.RECLAIM)
    return Outcome(a, status)


def test_only_jobs_exactly_on_their_allocation_and_unshared_are_gated():
    at = job(1, {0, 1}, {0, 1})
    grown = job(2, {2}, {2, 3})
    lender = job(3, {4, 5}, {4})
    borrower = job(4, {6}, {6, 5})          # holds core 5 of job 3
    rigid = job(5, {7}, {7}, )
    assert gated_jobs(snap(at, grown, lender, borrower, rigid), []) == {1, 5}


def test_the_outcome_of_the_cycle_decides_and_a_failed_action_gates_nobody_it_touched():
    grown = job(2, {2}, {2, 3})
    other = job(3, {3}, {})          # lent its core to job 2
    shrink = outcome(grown, {2})
    give_back = Outcome(Action(ActionKind.GROW, 3, 1000, S({3}), S(), S({3}), (1,),
                               Reason.RECLAIM), OutcomeStatus.APPLIED)
    assert gated_jobs(snap(grown, other), [shrink, give_back]) == {2, 3}
    failed = outcome(grown, {2}, OutcomeStatus.FAILED)
    # Job 2 may still hold core 3: neither is gated.
    assert gated_jobs(snap(grown, other), [failed, give_back]) == set()


def test_a_fault_or_folders_out_of_line_are_never_gated():
    assert gated_jobs(snap(job(1, {0}, {0}, fault="bad record")), []) == set()
    assert gated_jobs(snap(job(1, {0}, {0}, folders_in_line=False)), []) == set()


def test_a_starting_job_is_gated_only_while_nobody_holds_a_core_outside_its_allocation():
    calm = job(1, {0, 1}, {0, 1})
    assert gated_jobs(snap(calm, pending=(9,)), []) == {1, 9}
    grown = job(2, {2}, {2, 3})
    assert 9 not in gated_jobs(snap(calm, grown, pending=(9,)), [])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.frozensets(st.integers(0, 7), min_size=1),
                          st.frozensets(st.integers(0, 7))), min_size=1, max_size=5))
def test_no_gated_job_shares_a_core_or_holds_other_than_its_allocation(pairs):
    jobs = [job(i + 1, a, c) for i, (a, c) in enumerate(pairs)]
    for jid in gated_jobs(snap(*jobs), []):
        j = jobs[jid - 1]
        assert j.current == j.allocation
        assert not any(o.current & j.allocation for o in jobs if o.job_id != jid)


def test_gates_are_published_exactly_and_closed_before_acting(tmp_path):
    gate = StepGate(tmp_path, "n1")
    gate.publish({3, 7})
    assert sorted(os.listdir(gate.gates)) == ["3", "7"]
    assert os.stat(gate.gates).st_mode & 0o777 == 0o700
    (gate.gates / "junk").write_text("x")
    gate.publish({7, 8})
    assert sorted(os.listdir(gate.gates)) == ["7", "8"]
    gate.close([7, 99])
    assert sorted(os.listdir(gate.gates)) == ["8"]


def test_fence_files_are_read_then_removed_and_bad_ones_ignored(tmp_path):
    gate = StepGate(tmp_path, "n1")
    gate.prepare()
    (gate.fences / "41.step_0").write_text("1234 1795600000.250\n")
    (gate.fences / "41.step_batch").write_text("77 1795600001.000\n")
    for name, text in [("42.step_../x", ""), ("nope", "1 2"), ("43.step_1", "x y"),
                       ("44.step_1", "5 1e300"), ("45.step_1", "-5 100")]:
        if "/" not in name:
            (gate.fences / name).write_text(text)
    found, good = gate.read_fences()
    assert set(good) == {(41, "step_0"), (41, "step_batch")}
    assert good[(41, "step_0")].stepd_pid == 1234
    assert good[(41, "step_0")].since == pytest.approx(1795600000.25)
    assert len(found) == 6
    gate.remove_fences(found)
    assert os.listdir(gate.fences) == []


def test_requests_decode_strictly():
    r = StepStartRequest(41, "step_batch", 1234)
    assert StepStartRequest.decode(r.encode()) == r
    for bad in [b"", b"step-start 41 step_0 12", b"step-start 0 step_0 12\n",
                b"step-start 41 step_../x 12\n", b"step-start 41 step_0 12\nmore",
                b"step-start 41  step_0 12\n", b"step-start 41 step_0 -1\n",
                "step-start \u0663 step_0 1\n".encode()]:
        with pytest.raises(ValueError):
            StepStartRequest.decode(bad)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=140))
def test_request_decoding_never_raises_other_than_valueerror(raw):
    try:
        r = StepStartRequest.decode(raw)
    except ValueError:
        return
    assert StepStartRequest.decode(r.encode()) == r


def _ask(path, line: bytes, timeout=5.0) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(line)
        out = b""
        while not out.endswith(b"\n"):
            chunk = s.recv(2048)
            if not chunk:
                break
            out += chunk
        return out


@pytest.mark.skipif(os.geteuid() != 0, reason="the server answers root only")
def test_the_server_queues_a_root_request_for_the_loop_and_answers_its_verdict(tmp_path):
    wake = threading.Event()
    server = StepStartServer(tmp_path / "agent-n1.sock", wake)
    server.start()
    try:
        assert os.stat(tmp_path / "agent-n1.sock").st_mode & 0o777 == 0o600
        answers = {}

        def client():
            answers["ok"] = _ask(tmp_path / "agent-n1.sock", b"step-start 41 step_0 1234\n")
        t = threading.Thread(target=client)
        t.start()
        assert wake.wait(5)
        deadline = time.monotonic() + 5
        pending = []
        while not pending and time.monotonic() < deadline:
            pending = server.take()
            time.sleep(0.01)
        assert [p.request for p in pending] == [StepStartRequest(41, "step_0", 1234)]
        pending[0].answer(encode_answer(Verdict(resizes=1, ms=3.0)))
        t.join(5)
        assert answers["ok"] == b"ok 1 3\n"
        refused = _ask(tmp_path / "agent-n1.sock", b"step-start nonsense\n")
        assert refused.startswith(b"refused not a step-start request")
        assert encode_answer(Verdict(problems=["job 4 holds\n[3]"])) == \
            b"refused job 4 holds [3]\n"
    finally:
        server.stop()
    assert not (tmp_path / "agent-n1.sock").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs another uid to connect as")
def test_anyone_but_root_is_hung_up_on(tmp_path):
    """A socket made reachable on purpose (mode 0777 here; the real one is 0600 in a 0700
    folder): a nobody peer gets no answer and nothing is queued."""
    import subprocess
    import tempfile
    wake = threading.Event()
    folder = Path(tempfile.mkdtemp(prefix="step-socket-", dir="/tmp"))
    folder.chmod(0o755)
    path = folder / "agent-n1.sock"
    server = StepStartServer(path, wake)
    server.start()
    try:
        os.chmod(path, 0o777)
        # The server may hang up before the request is even sent (a broken pipe): hung up on.
        code = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"
                "try:\n    s.sendall(b'step-start 41 step_0 1234\\n')\n"
                "    print(repr(s.recv(100)))\n"
                "except (ConnectionResetError, BrokenPipeError):\n    print('reset')\n")
        out = subprocess.run(["/usr/bin/python3", "-c", code, str(path)], user=65534,
                             capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() in ("b''", "reset"), out
        time.sleep(0.1)
        assert server.take() == [] and not wake.is_set()
    finally:
        server.stop()
        folder.rmdir()


def test_a_burst_of_step_starts_costs_one_cycle_for_all(tmp_path):
    """Issue 40, finding 7: each request had a cycle of its own, so one user's burst of sruns
    put every other user's step start behind it (then to the slow hook, which kills the
    agent after 3 s). Every request queued since the last look is fenced in one cycle and
    answered by it; a request whose slurmstepd is not root's is refused alone."""
    from slurm_plugin.node.config import AgentConfig
    me = os.getpid()                 # root's, as a slurmstepd is
    asks = [f"step-start 41 step_{i} {me}\n".encode() for i in range(6)] + \
        [f"step-start 42 step_0 {me}\n".encode(), b"step-start 43 step_0 1\n"]
    config = AgentConfig(node="n1", state_dir=tmp_path / "state", run_dir=tmp_path / "run")
    cycles, answers, _ = _burst(tmp_path, config, asks, turns=1)
    assert len(cycles) == 1
    assert sorted((j, f.step) for j, f in cycles[0]["fences"]) == \
        [(41, f"step_{i}") for i in range(6)] + [(42, "step_0")]
    assert all(answers[a].startswith(b"ok 0") for a in asks[:-1]), answers
    assert answers[asks[-1]].startswith(b"refused"), answers


def test_one_users_burst_of_step_starts_is_served_in_turns_beside_others(tmp_path):
    """Issue 40, bounded per user: 20 step starts of one user's job and one of another
    user's: the first cycle fences 16 of his (MAX_STARTS_PER_USER) and the other user's, the
    next the 4 left, which were handed back ahead of newer requests with the loop woken."""
    from slurm_plugin.daemon.agent import MAX_STARTS_PER_USER
    from slurm_plugin.node.config import AgentConfig
    from slurm_plugin.node.ledger import Allocation, Ledger, LedgerFile
    config = AgentConfig(node="n1", state_dir=tmp_path / "state", run_dir=tmp_path / "run")
    config.state_dir.mkdir()
    LedgerFile(config.state_dir, "n1").save(Ledger(allocations={
        41: Allocation(1000, frozenset({0})), 42: Allocation(1001, frozenset({1}))}))
    me = os.getpid()
    asks = [f"step-start 41 step_{i} {me}\n".encode() for i in range(20)] + \
        [f"step-start 42 step_0 {me}\n".encode()]
    cycles, answers, woken = _burst(tmp_path, config, asks, turns=2)
    assert woken == [True, False]                # the loop came back for the rest
    first = [(j, f.step) for j, f in cycles[0]["fences"]]
    assert len(first) == MAX_STARTS_PER_USER + 1 and (42, "step_0") in first
    assert len(cycles[1]["fences"]) == 20 - MAX_STARTS_PER_USER
    assert all(answers[a].startswith(b"ok 0") for a in asks), answers


def _burst(tmp_path, config, asks: list[bytes], *, turns: int):
    """``asks`` sent at once to a real step socket, each from a thread of its own; then
    ``turns`` calls of the agent's ``serve_step_starts`` with a reconciler that records its
    cycles. Returns the cycles' arguments, each request's answer, and whether the loop was
    woken again after each turn."""
    from types import SimpleNamespace
    from slurm_plugin.daemon.agent import serve_step_starts
    from slurm_plugin.node.reconciler import CycleResult
    wake = threading.Event()
    path = tmp_path / "agent-n1.sock"
    server = StepStartServer(path, wake)
    server.start()
    answers: dict[bytes, bytes] = {}
    clients = [threading.Thread(target=lambda a=a: answers.__setitem__(a, _ask(path, a)))
               for a in asks]
    cycles: list[dict] = []
    woken = []
    rec = SimpleNamespace(cycle=lambda **m: cycles.append(m) or CycleResult(),
                          observer=SimpleNamespace(actuator=SimpleNamespace(scan=dict, unidentified={})))
    try:
        for t in clients:
            t.start()
        deadline = time.monotonic() + 10
        while server._queue.qsize() < len(asks) and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(turns):
            wake.clear()
            serve_step_starts(config, rec, server)
            woken.append(wake.is_set())
        for t in clients:
            t.join(5)
    finally:
        server.stop()
    return cycles, answers, woken
