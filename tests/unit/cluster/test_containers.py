"""The container co-scheduler's pure parts, on `docker inspect` output captured from Docker 20.10
here (tests/fixtures/docker_inspect.json: mtf-fixture-a running, label min=1,max=node,weight=2,
cpuset 1; mtf-fixture-bad created, label min=0)."""
from pathlib import Path

import pytest

from slurm_plugin.containers import (Container, ContainerActuator, ContainerParseError,
                                                 ContainerStatus, admit, node_snapshot,
                                                 parse_inspect)
from malleable_policy.model import Policy
from malleable_policy.decide import decide
from malleable_policy.request import MalleableSpec

FIX = Path(__file__).parents[2] / "fixtures" / "docker_inspect.json"
ALL = frozenset({0, 1, 2, 3})


def test_parse_captured_inspect():
    a, bad = parse_inspect(FIX.read_text())
    assert (a.name, a.status, a.cpuset) == ("mtf-fixture-a", ContainerStatus.RUNNING, {1})
    assert a.spec == MalleableSpec(min_cpus=1, max_cpus=None, weight=2)
    assert a.job_id == int(a.id[:8], 16)
    assert bad.status is ContainerStatus.CREATED and bad.spec is None
    assert "min" in bad.label_error


@pytest.mark.parametrize("text", ["not json", "{}", '[{"Id": "../../x", "State": {"Status": "running"}}]',
                                  '[{"Id": "abcdef0123456789", "State": {"Status": "flying"}}]'])
def test_bad_inspect_is_a_typed_error(text):
    with pytest.raises(ContainerParseError):
        parse_inspect(text)


def c(cid: str, status: str = "created", min_cpus: int = 1, created: str = "t1",
      cpuset: frozenset[int] = frozenset()) -> Container:
    return Container(id=cid * 16, name=f"c{cid}", status=ContainerStatus(status), created=created,
                     cpuset=cpuset, spec=MalleableSpec(min_cpus=min_cpus))


def test_admission_in_creation_order_and_waiting():
    a, b, w = c("a", min_cpus=2, created="t1"), c("b", created="t2"), c("d", min_cpus=2, created="t3")
    got = admit({}, [w, b, a], ALL)
    assert got == {a.id: {0, 1}, b.id: {2}}            # w needs 2, one is left: it waits
    # a exits: its cores go to the one waiting; b keeps its own.
    gone = Container(**{**a.__dict__, "status": ContainerStatus.EXITED})
    again = admit(got, [gone, b, w], ALL)
    assert again == {b.id: {2}, w.id: {0, 1}}


def test_a_new_container_starts_on_cores_taken_back_from_a_lender():
    """A holds every core (lent); B is admitted on one: the plan shrinks A first, then B's
    action (grow from nothing) starts it, on cores no other container holds."""
    a = c("a", status="running", cpuset=ALL)
    alloc = admit({}, [a], ALL)
    assert alloc == {a.id: {0}}
    plan = decide(node_snapshot("h", ALL, [a], alloc), Policy.LEND_IDLE)
    assert plan.targets[a.job_id] == ALL                # alone: every idle core lent to it
    b = c("b", created="t2")
    alloc = admit(alloc, [a, b], ALL)
    snap = node_snapshot("h", ALL, [a, b], alloc)
    plan = decide(snap, Policy.LEND_IDLE)
    assert plan.targets[b.job_id] == alloc[b.id] == {1}
    assert not plan.targets[a.job_id] & plan.targets[b.job_id]
    assert {x.job_id: x.kind.value for x in plan.actions} == {a.job_id: "shrink"}


class FakeDocker:
    """Records what the co-scheduler asks of docker; ``fail_update`` makes updates fail."""

    def __init__(self, containers, fail_update=()):
        self.listed, self.calls, self.fail_update = containers, [], set(fail_update)

    def containers(self):
        return self.listed

    def set_cpus(self, cid, cpus):
        from malleable_protocol.runner import CommandError
        if cid in self.fail_update:
            raise CommandError(["docker", "update"], 1, "boom")
        self.calls.append(("update", cid[:1], sorted(cpus)))

    def start(self, cid):
        self.calls.append(("start", cid[:1]))


def test_cycle_starts_the_new_container_only_after_the_lender_shrank(tmp_path):
    from slurm_plugin.containers import ContainerCoScheduler
    a, b = c("a", status="running", cpuset=ALL), c("b", created="t2")
    docker = FakeDocker([a])
    cs = ContainerCoScheduler("h", ALL, Policy.LEND_IDLE, tmp_path, docker)
    cs.cycle()
    docker.listed = [a, b]
    result = cs.cycle()
    assert docker.calls == [("update", "a", [0, 2, 3]), ("update", "b", [1]), ("start", "b")]
    assert result.started == ["cb"]
    # When the lender's update fails, the new container is not started on its cores.
    docker2 = FakeDocker([a], fail_update={a.id})
    cs2 = ContainerCoScheduler("h", ALL, Policy.LEND_IDLE, tmp_path / "2", docker2)
    cs2.cycle()
    docker2.listed = [a, b]
    assert cs2.cycle().started == [] and docker2.calls == []


def test_actuator_refuses_an_empty_cpuset_and_an_unknown_container():
    from slurm_plugin.node.cgroup_actuator import ActuatorError
    a = c("a", status="running")
    act = ContainerActuator(FakeDocker([a]), [a])
    with pytest.raises(ValueError):
        act.apply(0, a.job_id, frozenset())
    with pytest.raises(ActuatorError):
        act.apply(0, 12345, frozenset({0}))
