"""The agent's policy (``malleable_policy.decide``) on the node snapshots a simulation gives
it: microseconds per decide, and, with ``--against REF``, the same snapshots decided by the
code of another commit, in turns, with the plans compared one by one.

The snapshots are recorded from simulator runs (cgroup-only, lend-idle and throughput; the
project's workload on 200 x 64 cores and Lublin-Feitelson's on 64 x 16), the same every time.

    python -m benchmarks.node.decide_speed [--against aff8419] [--rounds 3] [--name decide_speed]
"""
from __future__ import annotations

import argparse
import contextlib
import pickle
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, checkout_of, machine, median, run_worker, save


def record(path: Path) -> int:
    """Run the simulations and keep every (snapshot, policy) their agents decide on."""
    import malleable_sim.engine as engine
    from malleable_sim import Placement, SimPolicy, Simulation, generate
    from malleable_sim.lublin import generate_lublin

    corpus = []
    real = engine.decide

    def recording(snapshot, policy):
        corpus.append((snapshot, policy))
        return real(snapshot, policy)

    engine.decide = recording      # the engine's one call of the policy, for this process only
    try:
        for regime in (SimPolicy.CGROUP_ONLY, SimPolicy.LEND_IDLE, SimPolicy.THROUGHPUT):
            for jobs, nodes, cores in ((generate(4000, 200, 64, 0.5, 1), 200, 64),
                                       (generate_lublin(800, 64, 16, 0.5, 2, offered=0.85), 64,
                                        16)):
                Simulation(regime.submitted(jobs, 0.25, cores), nodes=nodes, cores=cores,
                           policy=regime, placement=Placement.SLURM_TASKS).run()
    finally:
        engine.decide = real
    path.write_bytes(pickle.dumps(corpus))
    return len(corpus)


def time_decides(corpus_path: Path, plans_path: Path, repeats: int) -> dict:
    """Worker: decide every snapshot ``repeats`` times with the code on sys.path; the best."""
    from malleable_policy import decide as policy
    corpus = pickle.loads(corpus_path.read_bytes())
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        plans = [policy.decide(s, p) for s, p in corpus]
        best = min(best, time.perf_counter() - t0)
    plans_path.write_bytes(pickle.dumps(plans))
    return {"snapshots": len(corpus), "best_s": best, "us_per_decide": best / len(corpus) * 1e6,
            "policy_file": policy.__file__}


def worker(code_root: Path, corpus: Path, plans: Path, repeats: int) -> dict:
    return run_worker(__spec__.name, ["--worker", str(corpus), str(plans), str(repeats)],
                      code_root=code_root, timeout=1800)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", help="a commit whose decide runs the same snapshots in turns (one "
                    "that has malleable_policy: the snapshots are pickled by its class paths)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="decides of the corpus per turn")
    ap.add_argument("--name", default="decide_speed")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        corpus, plans, repeats = args.worker
        import json
        print("RESULT " + json.dumps(time_decides(Path(corpus), Path(plans), int(repeats))))
        return
    with tempfile.TemporaryDirectory(prefix="decide-speed-") as tmp:
        tmp = Path(tmp)
        corpus = tmp / "corpus.pkl"
        n = record(corpus)
        print(f"{n} snapshots recorded", flush=True)
        roots = {"this checkout": REPO}
        with contextlib.ExitStack() as stack:
            if args.against:
                roots[args.against] = stack.enter_context(checkout_of(args.against,
                                                                      tmp / "against"))
            runs: dict[str, list[dict]] = {name: [] for name in roots}
            plans = {name: tmp / f"plans-{k}.pkl" for k, name in enumerate(roots)}
            for _ in range(args.rounds):       # in turns: the machine's drifts hit both alike
                for name, root in roots.items():
                    runs[name].append(worker(root, corpus, plans[name], args.repeats))
                    print(name, f"{runs[name][-1]['us_per_decide']:.1f} us", flush=True)
            differing = None
            if args.against:
                mine, theirs = (pickle.loads(plans[name].read_bytes()) for name in roots)
                differing = sum(a != b for a, b in zip(mine, theirs)) + abs(len(mine) -
                                                                            len(theirs))
    result = {"benchmark": "decide per node snapshot (recorded from simulator runs)",
              "machine": machine(), "snapshots": n, "rounds": args.rounds,
              "us_per_decide": {name: [round(r["us_per_decide"], 1) for r in rs]
                                for name, rs in runs.items()},
              "median_us": {name: round(median([r["us_per_decide"] for r in rs]), 1)
                            for name, rs in runs.items()},
              "policy_file": {name: rs[0]["policy_file"] for name, rs in runs.items()}}
    if args.against:
        result["against"] = args.against
        result["ratio_this_over_against"] = round(result["median_us"]["this checkout"] /
                                                  result["median_us"][args.against], 3)
        result["differing_plans"] = differing
    print(result)
    save(args.name, result)


if __name__ == "__main__":
    main()
