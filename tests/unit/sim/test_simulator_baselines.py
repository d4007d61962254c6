"""Honest baselines: static at full size, static with the malleable regimes' asks and no agent,
cgroup-only, lend-idle and throughput side by side, so that the agent's own effect (against the
regime without an agent whose jobs ask for the same) is reported apart from the effect of asking
for less (against static)."""
from __future__ import annotations

import json

import pytest

from malleable_policy.model import Policy
from malleable_policy.request import MalleableSpec
from malleable_sim import Amdahl, SimJob, SimPolicy, generate, simulate
from malleable_sim.metrics import COMPARED

LINEAR = Amdahl(serial=0.0, comm=0.0)


def test_the_regimes_their_asks_agents_and_baselines():
    assert [p.value for p in SimPolicy] == ["static", "static-ask", "moldable", "cgroup-only",
                                            "lend-idle", "throughput", "nodes"]
    table = {p: (p.asks_less, p.threads_follow, p.agent_policy, p.same_asks_baseline)
             for p in SimPolicy}
    assert table == {
        SimPolicy.STATIC: (False, False, None, None),
        SimPolicy.STATIC_ASK: (True, False, None, None),
        SimPolicy.MOLDABLE: (False, False, None, None),
        SimPolicy.CGROUP_ONLY: (False, False, Policy.LEND_IDLE, SimPolicy.STATIC),
        SimPolicy.LEND_IDLE: (True, True, Policy.LEND_IDLE, SimPolicy.STATIC_ASK),
        SimPolicy.THROUGHPUT: (True, True, Policy.THROUGHPUT, SimPolicy.STATIC_ASK),
        SimPolicy.NODES: (False, False, None, SimPolicy.STATIC)}


def test_static_ask_submits_what_the_malleable_regimes_submit_and_runs_it_without_an_agent():
    jobs = generate(200, 4, 16, 0.5, 7)
    asked = SimPolicy.STATIC_ASK.submitted(jobs, 0.25, 16)
    assert asked == SimPolicy.THROUGHPUT.submitted(jobs, 0.25, 16) \
        == SimPolicy.LEND_IDLE.submitted(jobs, 0.25, 16)
    assert asked != SimPolicy.STATIC.submitted(jobs, 0.25, 16) == jobs
    r = simulate(asked, nodes=4, cores=16, policy=SimPolicy.STATIC_ASK)
    assert (r.resizes, r.decide_calls) == (0, 0)
    # One malleable job asking a quarter of 4 cores: static-ask runs it on 1 core (4x as
    # long), lend-idle grows it back to 4.
    job = SimJob(1, 0.0, 4, 100.0, LINEAR, MalleableSpec(min_cpus=1, max_cpus=4))
    ends = {p: simulate(p.submitted([job], 0.25, 4), nodes=1, cores=4, policy=p).makespan_s
            for p in SimPolicy}
    assert ends == {SimPolicy.STATIC: 100.0, SimPolicy.STATIC_ASK: 400.0,
                    SimPolicy.MOLDABLE: 100.0,     # linear: the size asked for is the knee
                    SimPolicy.CGROUP_ONLY: 100.0, SimPolicy.LEND_IDLE: 100.0,
                    SimPolicy.THROUGHPUT: 100.0, SimPolicy.NODES: 100.0}


def test_the_json_splits_the_agents_own_effect_from_asking_for_less(tmp_path):
    from malleable_sim.cli import main
    out = tmp_path / "out.json"
    assert main(["--nodes", "4", "--cores", "16", "--jobs", "300", "--policy",
                 "all", "--malleable-ask", "0.25", "--offered-load", "1.5", "--seed", "2",
                 "--json", str(out)]) == 0
    rows = {r["policy"]: r for r in json.loads(out.read_text())}
    assert "vs_static" not in rows["static"] and "vs_same_asks" not in rows["static"]
    assert "vs_same_asks" not in rows["static-ask"]
    assert rows["cgroup-only"]["vs_same_asks"] == rows["cgroup-only"]["vs_static"]
    for p in ("lend-idle", "throughput"):
        own, total = rows[p]["vs_same_asks"], rows[p]["vs_static"]
        ask = rows["static-ask"]["vs_static"]
        assert set(own) == set(COMPARED)
        for m in COMPARED:
            assert own[m] == pytest.approx(rows[p][m] / rows["static-ask"][m])
            # The total is the product of the two effects.
            assert total[m] == pytest.approx(own[m] * ask[m])


def test_the_moldable_oracle_takes_each_jobs_knee_and_keeps_it():
    """The oracle sizes a malleable job at its processor working set (largest S(n)^2/n) up to
    what it asked for, in whole nodes for a wide job, and runs it there with no agent; rigid
    jobs are left alone. Under a steep Amdahl curve it shrinks the job, at an efficiency of at
    least 0.5 it barely does."""
    from malleable_sim.workload import efficacy, moldable, moldable_size
    steep = Amdahl(serial=0.08, comm=0.0)             # knee at (1 - s) / s = 11.5
    spec = MalleableSpec(min_cpus=1, max_cpus=None)
    job = SimJob(1, 0.0, 32, 100.0, steep, spec, time_limit_s=200.0)
    assert moldable_size(job, 64) == max(range(1, 33), key=lambda n: efficacy(steep, n)) == 12
    wide = SimJob(2, 0.0, 256, 100.0, steep, spec)
    assert moldable_size(wide, 64) == 64               # whole nodes: 1 of 4
    for efficiency, size in ((0.5, 30), (0.6, 32)):      # at 32 cores; knee (1 - s) / s
        gentle = Amdahl(serial=(1 / efficiency - 1) / 31, comm=0.0)
        assert moldable_size(SimJob(3, 0.0, 32, 100.0, gentle, spec), 64) == size
    rigid = SimJob(4, 0.0, 32, 100.0, steep)
    molded, same = moldable([job, rigid], 64)
    assert same == rigid and molded.cores == 12
    assert molded.work == pytest.approx(job.work)    # the same work, more slowly
    assert molded.runtime_s == pytest.approx(job.work / steep.rate(12))
    assert molded.time_limit_s == pytest.approx(200.0 * molded.runtime_s / 100.0)
    assert molded.reference_s == 100.0               # bounded slowdown against the asked size
    r = simulate(SimPolicy.MOLDABLE.submitted([job], 0.25, 64), nodes=1, cores=64,
                 policy=SimPolicy.MOLDABLE)
    assert (r.resizes, r.decide_calls) == (0, 0)
    assert r.makespan_s == pytest.approx(molded.runtime_s)
