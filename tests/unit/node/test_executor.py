"""The executor: safe order, failed shrinks cancel the grows that needed their cores, ranks told
before their cores go, every outcome reported."""
import signal

import pytest

from malleable_protocol import RunLayout, Target
from slurm_plugin.cgroups import CgroupVersion, SlurmCgroupLayout
from slurm_plugin.node.cgroup_actuator import ActuatorError
from malleable_policy.model import OutcomeStatus
from slurm_plugin.node.executor import PlanExecutor
from malleable_policy.model import (JobView, NodeSnapshot, Policy, RankView)
from malleable_policy.decide import decide
from malleable_policy.request import MalleableSpec

M = MalleableSpec


class FakeActuator:
    layout = SlurmCgroupLayout.named("n1", CgroupVersion.V1, multiple_slurmd=True)

    def __init__(self, fail=()):
        self.fail = set(fail)
        self.applied = []

    def apply(self, uid, job_id, cpus, step_cpus=None, *, allocation=None):
        if job_id in self.fail:
            raise ActuatorError(f"EBUSY writing job {job_id}")
        self.applied.append((job_id, frozenset(cpus)))


def view(jid, alloc, current, spec=M(1, None), ranks=(), req=None):
    return JobView(job_id=jid, uid=1000, user="u", allocation=frozenset(alloc),
                   current=frozenset(current), spec=spec, ranks=ranks, requested=req)


def executor(tmp_path, actuator, calls, ranks_after=None):
    def read_ranks(layout, job_id, uid, node):
        calls.append(("read", job_id))
        return ranks_after or ()
    return PlanExecutor("n1", RunLayout(tmp_path), actuator, shrink_wait_s=0.05,
                        read_ranks=read_ranks, check_pid=lambda *a: True,
                        send_signal=lambda pid, sig, check: check(pid) and not
                        calls.append(("signal", pid, sig)))


def test_a_failed_shrink_cancels_the_grow_that_needed_its_cores(tmp_path):
    # Job 1 holds {0..3} and must give 2,3 back (a request); job 2 asks for them.
    snap = NodeSnapshot("n1", frozenset(range(4)), (
        view(1, {0}, {0, 1, 2, 3}, req=2), view(2, {2}, {2}, req=3)))
    plan = decide(snap, Policy.LEND_IDLE)
    act = FakeActuator(fail={1})
    out = {o.action.job_id: o for o in executor(tmp_path, act, []).execute(plan, snap)}
    assert out[1].status is OutcomeStatus.FAILED and "EBUSY" in out[1].error
    assert out[2].status is OutcomeStatus.CANCELLED and "[1]" in out[2].error
    assert act.applied == []           # nobody was given a core job 1 still holds


def test_shrinks_run_first_and_ranks_park_before_the_cpuset_narrows(tmp_path):
    r = RankView(pid=77, rank=0, local_rank=0, local_size=1, intra_active=4)
    snap = NodeSnapshot("n1", frozenset(range(4)), (
        view(2, {2}, {2}, req=3), view(1, {0}, {0, 1, 2, 3}, ranks=(r,), req=1)))
    plan = decide(snap, Policy.LEND_IDLE)
    calls, act = [], FakeActuator()
    parked = (RankView(pid=77, rank=0, local_rank=0, local_size=1, intra_active=1),)
    out = executor(tmp_path, act, calls, ranks_after=parked).execute(plan, snap)
    assert [o.status for o in out] == [OutcomeStatus.APPLIED, OutcomeStatus.APPLIED]
    assert [j for j, _ in act.applied] == [1, 2]                 # the shrink first
    assert calls[0] == ("signal", 77, signal.SIGUSR1) and calls[1] == ("read", 1)
    target = Target.decode((RunLayout(tmp_path).target_file(1, "n1")).read_bytes())
    assert target.cpus == {0}                                    # root's file, the new set


def test_a_cyclic_exchange_is_not_attempted(tmp_path):
    from malleable_policy.model import Action, ActionKind, Plan, Reason
    a = Action(ActionKind.MOVE, 1, 0, frozenset({0}), frozenset({0}), frozenset({1}), (1,),
               Reason.LEND_IDLE)
    b = Action(ActionKind.MOVE, 2, 0, frozenset({1}), frozenset({1}), frozenset({0}), (1,),
               Reason.LEND_IDLE)
    snap = NodeSnapshot("n1", frozenset({0, 1}), (view(1, {0}, {0}), view(2, {1}, {1})))
    plan = Plan("n1", Policy.LEND_IDLE, {1: frozenset({1}), 2: frozenset({0})}, {}, (a, b))
    act = FakeActuator()
    out = executor(tmp_path, act, []).execute(plan, snap)
    assert {o.status for o in out} == {OutcomeStatus.CANCELLED} and act.applied == []


def test_ranks_that_never_park_cost_one_bounded_wait_whatever_the_number_of_jobs(tmp_path):
    jobs = tuple(view(j, {j}, {j, j + 10}, req=1,
                      ranks=(RankView(pid=100 + j, rank=0, local_rank=0, local_size=1,
                                      intra_active=2),)) for j in range(1, 9))
    snap = NodeSnapshot("n1", frozenset(range(20)), jobs)
    plan = decide(snap, Policy.LEND_IDLE)
    assert len(plan.actions) == 8
    now = [0.0]

    def sleep(dt):
        now[0] += dt

    def stubborn(layout, job_id, uid, node):
        return tuple(j.ranks[0] for j in jobs if j.job_id == job_id)
    ex = PlanExecutor("n1", RunLayout(tmp_path), FakeActuator(), shrink_wait_s=0.5,
                      read_ranks=stubborn, check_pid=lambda *a: True,
                      send_signal=lambda pid, sig, check: False, clock=lambda: now[0], sleep=sleep)
    out = ex.execute(plan, snap)
    assert all(o.status is OutcomeStatus.APPLIED for o in out)
    assert now[0] <= 0.51          # one shared wait, not 8 x 0.5 s


@pytest.mark.parametrize("declared,sent", [
    (signal.SIGRTMIN + 3, signal.SIGRTMIN + 3),    # the runtime's default
    (signal.SIGUSR2, signal.SIGUSR2),
    (signal.SIGUSR1, signal.SIGUSR1),              # a record from before the field says this
    (None, None),                                  # no reload signal mapped: it polls
    (signal.SIGKILL, None), (signal.SIGTERM, None), (0, None), (signal.SIGRTMAX + 1, None),
])
def test_each_rank_gets_the_signal_its_record_names_and_no_other(tmp_path, declared, sent):
    r = RankView(pid=77, rank=0, local_rank=0, local_size=1, intra_active=1,
                 reload_signal=declared)
    snap = NodeSnapshot("n1", frozenset(range(4)), (view(1, {0}, {0, 1, 2, 3}, ranks=(r,),
                                                         req=1),))
    calls = []
    out = executor(tmp_path, FakeActuator(), calls, ranks_after=(r,)).execute(
        decide(snap, Policy.LEND_IDLE), snap)
    assert [o.status for o in out] == [OutcomeStatus.APPLIED]
    signals = [c for c in calls if c[0] == "signal"]
    # Told before the shrink and after it: the same signal both times, or none at all.
    assert signals == ([] if sent is None else [("signal", 77, sent)] * 2)
