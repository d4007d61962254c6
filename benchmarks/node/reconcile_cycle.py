"""CPU cost of one reconcile cycle with 64 jobs on a node (goal: under 20 ms of CPU).

The agent's whole cycle is measured, as the agent builds it (node.make_reconciler): reading
the node's feed (written by the watcher from squeue/sinfo JSON shaped like real Slurm 22.05
output, records cloned from tests/fixtures), the ledger, the cgroup tree of 64 jobs on tmpfs,
the policy, the plan and its execution, the offers and the report. Two cases: the feed
unchanged since the last cycle (the steady state: only a stat), and the feed rewritten before
every cycle (each cycle parses it).

    python -m benchmarks.node.reconcile_cycle [--jobs 64] [--cycles 200]
"""
from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, machine, median, percentile, save

from slurm_plugin.cgroups import CgroupVersion, SlurmCgroupLayout
from slurm_plugin.node.config import AgentConfig
from slurm_plugin.node.wiring import make_reconciler
from malleable_policy.model import Policy
from slurm_plugin.feed import FeedStore
from slurm_plugin.feed.watcher import build_feeds
from slurm_plugin.slurm.client import CliSlurmClient
from slurm_plugin.slurm.parsers import parse_nodes_json, parse_squeue_json

FIX = REPO / "tests" / "fixtures" / "slurm-22.05"


def synthetic_outputs(n_jobs: int, cores: int) -> tuple[str, str]:
    squeue = json.loads((FIX / "squeue_mixed.json").read_text())
    proto = next(j for j in squeue["jobs"] if j["job_state"] == "RUNNING")
    jobs = []
    for i in range(n_jobs):
        j = copy.deepcopy(proto)
        j["job_id"] = 1000 + i
        j["nodes"] = "n1"
        j["cpus"] = cores // n_jobs
        j["comment"] = "malleable:cpus=3" if i % 4 == 0 else ""
        j["admin_comment"] = "malleable:min=1,max=node,weight=1" if i % 2 == 0 else ""
        per = cores // n_jobs
        j["job_resources"]["allocated_nodes"] = [{
            "nodename": "n1", "cpus_used": per, "memory_used": 0, "memory_allocated": 0,
            "sockets": {"0": {"cores": {str(i * per + k): "allocated" for k in range(per)}}}}]
        jobs.append(j)
    squeue["jobs"] = jobs
    sinfo = json.loads((FIX / "sinfo.json").read_text())
    node = copy.deepcopy(sinfo["nodes"][0])
    node.update(name="n1", cpus=cores, cores=cores, sockets=1, threads=1)
    sinfo["nodes"] = [node]
    return json.dumps(squeue), json.dumps(sinfo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=64)
    ap.add_argument("--cores", type=int, default=128)
    ap.add_argument("--cycles", type=int, default=200)
    args = ap.parse_args()
    squeue, sinfo = synthetic_outputs(args.jobs, args.cores)
    nodes = parse_nodes_json(sinfo)
    jobs = CliSlurmClient()._with_cpu_ids(parse_squeue_json(squeue), nodes)
    feed = build_feeds(jobs, nodes, time.time())["n1"]
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        mount = Path(tmp) / "cg"
        (mount / "cpuset").mkdir(parents=True)
        (mount / "cpuset" / "cpuset.cpus").write_text(f"0-{args.cores - 1}")
        layout = SlurmCgroupLayout.named("n1", CgroupVersion.V1, multiple_slurmd=True,
                                         mount=mount)
        per = args.cores // args.jobs
        for i in range(args.jobs):
            d = layout.job_dir(0, 1000 + i) / "step_0"
            d.mkdir(parents=True)
            cpus = f"{i * per}-{i * per + per - 1}" if per > 1 else str(i)
            for f in (d, d.parent):
                (f / "cpuset.cpus").write_text(cpus)
        (layout.job_dir(0, 1000).parent / "cpuset.cpus").write_text(f"0-{args.cores - 1}")
        (layout.node_dir() / "cpuset.cpus").write_text(f"0-{args.cores - 1}")
        config = AgentConfig.under(Path(tmp), node="n1", policy=Policy.LEND_IDLE)
        config = AgentConfig(**{**config.__dict__, "cgroup_mount": mount})
        store = FeedStore(config.feed_dir)
        store.prepare()
        store.write_node(feed)
        rec = make_reconciler(config, layout)
        first = rec.cycle()
        assert not first.failures, first.failures
        out = {}
        for case in ("feed_unchanged", "feed_rewritten"):
            cpu_ms, wall_ms = [], []
            for _ in range(args.cycles):
                if case == "feed_rewritten":
                    store.write_node(feed)
                c0, w0 = time.process_time(), time.perf_counter()
                result = rec.cycle()
                cpu_ms.append((time.process_time() - c0) * 1000)
                wall_ms.append((time.perf_counter() - w0) * 1000)
                assert not result.failures, result.failures
            out[case] = {"cpu_ms": {"p50": median(cpu_ms), "p95": percentile(cpu_ms, 95),
                                    "max": max(cpu_ms)},
                         "wall_ms": {"p50": median(wall_ms), "p95": percentile(wall_ms, 95)}}
    data = {"benchmark": "reconcile_cycle", "machine": machine(), "jobs": args.jobs,
            "cores": args.cores, "cycles": args.cycles, "goal_cpu_ms": 20,
            "first_cycle_actions": len(first.outcomes), **out}
    save("reconcile_cycle", data)
    print(json.dumps({k: data[k] for k in ("jobs", "cores", "first_cycle_actions",
                                           "feed_unchanged", "feed_rewritten")}))


if __name__ == "__main__":
    main()
