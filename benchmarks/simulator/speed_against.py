"""The simulator's wall time on one workload with this checkout's code and, with ``--against
REF``, another commit's, in turns (the machine's drifts hit both alike), with each run's jobs
compared: a change meant to make it faster must give every job the same start and end.

Each run is a process of its own, its code on PYTHONPATH; it prints its wall time, makespan
and a hash of every job's (id, submit, start, end) with the run's resizes and decide calls.
The workload: the project's generated one on 1,000 x 64 cores (the issue's scale), or with
``--trace`` the first ``--jobs`` job lines of a Parallel Workloads Archive log in
tests/fixtures/swf/pwa on the nodes simulator/goals.py gives it (LLNL Thunder: its own 1,002
nodes of 4 cores), brought to ``--load`` as there.

    python -m benchmarks.simulator.speed_against --against d377dba [--jobs 50000] [--load 1.2]
        [--trace LLNL-Thunder-2007-1.1-cln.swf.gz] [--policies static,cgroup-only] [--rounds 2]
        [--name simulate_speed_against]
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, checkout_of, machine, median, run_worker, save, trace_workload

NODES, CORES = 1000, 64     # the scale


def workload(jobs: int, load: float, trace: str | None) -> tuple[list, int, int]:
    """The jobs, nodes and cores per node of a run (the same for every code root)."""
    from malleable_sim import WorkloadModel, generate
    from malleable_sim.lublin import scale_to_load
    if trace is None:
        return generate(jobs, NODES, CORES, 0.5, 1, WorkloadModel(offered_load=load)), NODES, \
            CORES
    wl, nodes, cores = trace_workload(trace, first=jobs, malleable_fraction=0.5)
    return scale_to_load(wl.jobs, load, nodes * cores), nodes, cores


def one_run(jobs: int, load: float, trace: str | None, policy: str, placement: str) -> dict:
    """Worker: one simulation with the code on sys.path."""
    import malleable_sim
    from malleable_sim import Placement, SimPolicy, Simulation
    regime = SimPolicy(policy)
    work, nodes, cores = workload(jobs, load, trace)
    t0 = time.perf_counter()
    r = Simulation(regime.submitted(work, 0.25, cores), nodes=nodes, cores=cores,
                   policy=regime, placement=Placement(placement)).run()
    wall = time.perf_counter() - t0
    # Every job's times, and what the agents did (the same jobs can be reached by other plans).
    per_job = repr([(j.job_id, j.submit_s, j.start_s, j.end_s) for j in r.per_job]) + \
        repr((r.resizes, r.decide_calls))
    return {"wall_s": wall, "makespan_s": r.makespan_s,
            "jobs_hash": hashlib.sha256(per_job.encode()).hexdigest()[:16],
            "code": malleable_sim.__file__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", help="a commit whose simulator runs the same jobs in turns")
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--load", type=float, default=1.2, help="offered load of the workload")
    ap.add_argument("--trace", help="a log in tests/fixtures/swf/pwa instead of the generated "
                                    "workload (--jobs: its first job lines)")
    ap.add_argument("--policies", default="static,cgroup-only")
    ap.add_argument("--placement", default="slurm-tasks")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--name", default="simulate_speed_against")
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        import json
        jobs, load, trace, policy, placement = args.worker
        print("RESULT " + json.dumps(one_run(int(jobs), float(load), trace or None, policy,
                                             placement)))
        return
    runs: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="simulate-speed-") as tmp, \
            contextlib.ExitStack() as stack:
        roots = {"this checkout": REPO}
        if args.against:
            roots[args.against] = stack.enter_context(checkout_of(args.against,
                                                                  Path(tmp) / "against"))
        for policy in args.policies.split(","):
            runs[policy] = {name: [] for name in roots}
            for _ in range(args.rounds):
                for name, root in roots.items():
                    got = run_worker(__spec__.name, ["--worker", str(args.jobs), str(args.load),
                                                      args.trace or "", policy, args.placement],
                                     code_root=root, timeout=3600)
                    runs[policy][name].append(got)
                    print(policy, name, f"{got['wall_s']:.1f} s", got["jobs_hash"], flush=True)
    rows = []
    for policy, by_root in runs.items():
        row = {"policy": policy,
               "wall_s": {name: [round(r["wall_s"], 2) for r in rs] for name, rs in
                          by_root.items()},
               "median_wall_s": {name: round(median([r["wall_s"] for r in rs]), 2)
                                 for name, rs in by_root.items()},
               "jobs_hashes": sorted({r["jobs_hash"] for rs in by_root.values() for r in rs}),
               "code": {name: rs[0]["code"] for name, rs in by_root.items()}}
        if args.against:
            row["ratio_this_over_against"] = round(row["median_wall_s"]["this checkout"] /
                                                   row["median_wall_s"][args.against], 3)
            row["same_jobs"] = len(row["jobs_hashes"]) == 1
        rows.append(row)
        print(row, flush=True)
    save(args.name, {"benchmark": "simulator wall time",
                     "workload": args.trace or f"generated (project), {NODES} x {CORES} cores",
                     "machine": machine(), "jobs": args.jobs, "offered_load": args.load,
                     "placement": args.placement, "rounds": args.rounds,
                     "against": args.against, "rows": rows})


if __name__ == "__main__":
    main()
