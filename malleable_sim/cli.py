"""``malleable-sim``: the co-scheduler's policies at cluster scale, in a discrete-event
simulation that runs the agent's own ``decide`` (a research tool; the node package leaves it
out).

Exit codes: 0 done; 1 it could not be done (a log that cannot be read, a bad value, numpy
missing), said in one line on stderr as ``malleable-sim: ...``; 2 the command line itself is
wrong (argparse's usage errors)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from malleable_protocol.errors import error_text

NEEDS_NUMPY = ("the simulator needs numpy, which is not installed here "
               "(pip install 'malleable-hpc[sim]')")


CORE_MOVE_S = 0.1     # see --core-move-cost


def build_parser() -> argparse.ArgumentParser:
    from . import Backfill, Placement, QueueOrder, SimPolicy, WorkloadModel
    sm = argparse.ArgumentParser(
        prog="malleable-sim", description="the co-scheduler's policies at cluster scale (a "
        "discrete-event simulation running the agent's decide)")
    workload_defaults = WorkloadModel()
    sm.add_argument("--nodes", type=int, default=100)
    sm.add_argument("--cores", type=int, default=64, help="cores per node")
    sm.add_argument("--jobs", type=int, default=0,
                    help="generated jobs (default 1000), or the first N lines of the SWF log")
    sm.add_argument("--swf", help="a Standard Workload Format log (.swf, or gzip-compressed "
                                  ".swf.gz as the Parallel Workloads Archive ships them) instead "
                                  "of a generated load")
    sm.add_argument("--malleable-fraction", type=float, default=0.5)
    sm.add_argument("--malleable-ask", type=float, default=1.0,
                    help="a malleable job that fits a node asks Slurm for this share of its "
                         "cores (at least 1) under static-ask, lend-idle and throughput, and "
                         "grows from there under the last two; static and cgroup-only run every "
                         "job at its size")
    sm.add_argument("--workload", default="project", choices=["project", "lublin"],
                    help="generated: this project's own model (default) or Lublin and "
                         "Feitelson's published fits with Downey speedup curves")
    sm.add_argument("--offered-load", type=float, default=workload_defaults.offered_load,
                    help="generated: work arriving per unit of capacity while jobs arrive "
                         "(lublin: its inter-arrival times scaled to reach it)")
    sm.add_argument("--swf-offered-load", type=float,
                    help="with --swf: scale the log's inter-arrival times so that cores x "
                         "runtime over cluster cores x arrival span is this (default: the "
                         "log's own submit times)")
    sm.add_argument("--max-runtime-h", type=float,
                    default=workload_defaults.runtime_max_s / 3600.0,
                    help="generated: the longest job's runtime at its allocation, hours")
    sm.add_argument("--policy", default="throughput",
                    choices=[p.value for p in SimPolicy] + ["all"],
                    help="the regime, or all of them side by side (static-ask: malleable jobs "
                         "ask for --malleable-ask of their size as under lend-idle and "
                         "throughput, with no agent); with all, each row is also given against "
                         "static (vs_static) and, where an agent runs, against the regime "
                         "without one whose jobs ask for the same (vs_same_asks: the agent's "
                         "own effect); nodes: malleable jobs of whole nodes shrink and grow "
                         "by whole nodes (Slurm's NumNodes, an expand job), no agent")
    sm.add_argument("--speedup", default="calibrated", choices=["calibrated", "downey", "round2"],
                    help="how each job's speedup curve is drawn: calibrated (Amdahl, parallel "
                         "efficiency U(0.5, 0.9) at the requested size; the default), downey "
                         "(A = the requested size), round2 (the second evaluation's model, "
                         "a sensitivity case); the Lublin workload always uses Downey's")
    sm.add_argument("--node-resize-cost", type=float, default=0.0, metavar="SECONDS",
                    help="a job given or taken a node does no work for this long (its cores "
                         "held): a restart from a checkpoint, an elastic resync")
    # The default is measured: the threads follow a cgroup's change in 4.2 ms p50, 9.5 ms p99
    # (TensorFlow, resize_latency.json) and 35 ms p50, 80 ms p95, 133 ms at most (PyTorch,
    # torch_latency.json), after the agent's cgroup write (under 2 ms in its logs): the
    # slowest, rounded up, counted as a pause with no work done.
    sm.add_argument("--core-move-cost", type=float, default=CORE_MOVE_S, metavar="SECONDS",
                    help="a job whose cores change within a node pauses this long (the cgroup "
                         f"write and the threads' resize; default {CORE_MOVE_S}: measured)")
    sm.add_argument("--regrow-after", type=float, default=0.0, metavar="SECONDS",
                    help="nodes regime: a job that gave a node back is not given one again for "
                         "this long (hysteresis; 0: at the next idle node)")
    sm.add_argument("--time-limits", default="enforced", choices=["enforced", "ignored"],
                    help="enforced (as Slurm: a job still running at its time limit ends then, "
                         "its work unfinished; the default) or ignored (every job runs to the "
                         "end of its work, as the second evaluation round did)")
    sm.add_argument("--seed", type=int, default=1)
    sm.add_argument("--backfill", default=Backfill.CONSERVATIVE.value,
                    choices=[b.value for b in Backfill],
                    help="Slurm's backfill: conservative (default: every job tested gets a "
                         "reservation, as Slurm does) or easy (only the first)")
    sm.add_argument("--backfill-depth", type=int, default=500,
                    help="queued jobs a backfill pass looks at (Slurm's bf_max_job_test)")
    sm.add_argument("--backfill-interval", type=float, default=30.0,
                    help="seconds between backfill passes (Slurm's bf_interval)")
    sm.add_argument("--backfill-window", type=float, default=1440.0,
                    help="minutes ahead a backfill pass plans: a job that cannot start within "
                         "them gets no reservation (Slurm's bf_window, 1440 by default; "
                         "conservative backfill only)")
    sm.add_argument("--batch-sched-delay", type=float, default=3.0,
                    help="the main scheduler runs for arrivals and ends at most once in this "
                         "many seconds (Slurm's batch_sched_delay, 3 by default)")
    sm.add_argument("--queue-order", default="fcfs",
                    choices=[o.value for o in QueueOrder],
                    help="Slurm's queue order in every regime: submission order (default), the "
                         "most cores first (multifactor job size), the longest time limit first")
    sm.add_argument("--placement", default=Placement.SLURM_TASKS.value,
                    choices=[p.value for p in Placement],
                    help="a job that fits a node when no node holds it: spreads as Slurm's "
                         "-n P does (slurm-tasks, default) or waits for one (one-node)")
    sm.add_argument("--closed-batch", action="store_true",
                    help="every job submitted at 0 (a closed batch) instead of when it arrives")
    sm.add_argument("--json", help="write the summary (a list with --policy all) here")
    return sm


def load_workload(args: argparse.Namespace):
    """The jobs to simulate (an SWF log's, or generated) and what the summary says of them."""
    from . import (SpeedupModel, Workload, WorkloadModel, generate, generate_lublin,
                   offered_load, read_swf, scale_to_load, swf_workload)
    speedup = SpeedupModel(args.speedup)
    if args.swf:
        log = read_swf(Path(args.swf).read_bytes())
        workload = swf_workload(log, nodes=args.nodes, cores=args.cores,
                                malleable_fraction=args.malleable_fraction, seed=args.seed,
                                first=args.jobs or None, speedup=speedup)
        if not workload.jobs:
            dropped = {k: v for k, v in workload.dropped.items() if v}
            raise ValueError(f"no job of {args.swf} to simulate: {workload.read} job lines "
                             f"read, dropped {dropped}")
        about = {"swf_header": log.header.summary(), "speedup_model": speedup.value,
                 "natural_offered_load": offered_load(workload.jobs, args.nodes * args.cores),
                 "offered_load": args.swf_offered_load}
        if args.swf_offered_load is not None:
            workload = dataclasses.replace(workload, jobs=tuple(scale_to_load(
                workload.jobs, args.swf_offered_load, args.nodes * args.cores)))
        return workload, about
    about = {"workload_model": args.workload, "offered_load": args.offered_load,
             "speedup_model": "downey" if args.workload == "lublin" else speedup.value}
    if args.workload == "lublin":
        return Workload(tuple(generate_lublin(args.jobs or 1000, args.nodes, args.cores,
                                              args.malleable_fraction, args.seed,
                                              offered=args.offered_load))), about
    model = WorkloadModel(offered_load=args.offered_load,
                          runtime_max_s=args.max_runtime_h * 3600.0)
    about["max_runtime_h"] = args.max_runtime_h
    return Workload(tuple(generate(args.jobs or 1000, args.nodes, args.cores,
                                   args.malleable_fraction, args.seed, model, speedup))), about


def simulate_regime(args: argparse.Namespace, policy, jobs):
    """One regime's run of ``jobs`` with the command line's cluster and Slurm settings."""
    from . import Backfill, NodeBounds, Placement, QueueOrder, ResizeCosts, Simulation, TimeLimits
    return Simulation(policy.submitted(jobs, args.malleable_ask, args.cores), nodes=args.nodes,
                      node_bounds=NodeBounds(regrow_after_s=args.regrow_after),
                      resize_costs=ResizeCosts(node_s=args.node_resize_cost,
                                               core_s=args.core_move_cost),
                      time_limits=TimeLimits(args.time_limits),
                      cores=args.cores, policy=policy, backfill=Backfill(args.backfill),
                      backfill_depth=args.backfill_depth,
                      backfill_interval_s=args.backfill_interval,
                      batch_sched_delay_s=args.batch_sched_delay,
                      backfill_window_s=args.backfill_window * 60.0,
                      queue_order=QueueOrder(args.queue_order),
                      placement=Placement(args.placement)).run()


SHORT = {"makespan_s": "makespan", "mean_response_s": "resp", "p95_response_s": "p95 resp",
         "mean_wait_s": "wait", "p95_wait_s": "p95 wait", "mean_bounded_slowdown": "bsld"}


def add_ratios(results: list[dict], policies) -> None:
    """Each row against static at full size (vs_static: the total effect) and against the
    regime without an agent whose jobs ask for the same (vs_same_asks: the agent's own), where
    both ran; each printed once."""
    from . import SimPolicy
    from .metrics import ratios
    by_policy = {row["policy"]: row for row in results}
    for policy in policies:
        row = by_policy[policy.value]
        for key, base in (("vs_static", SimPolicy.STATIC),
                          ("vs_same_asks", policy.same_asks_baseline)):
            if base is None or base is policy or base.value not in by_policy:
                continue
            row[key] = ratios(row, by_policy[base.value])
            if key == "vs_static" or base is not SimPolicy.STATIC:    # each line once
                print(f"{policy.value:12s} / {base.value:10s} " + "  ".join(
                    f"{SHORT[m]} {v:.3f}" for m, v in row[key].items() if v is not None))


def run(args: argparse.Namespace) -> int:
    """Simulates every asked regime on one workload, prints a row each (and the ratios
    between them), and writes the summaries to ``--json``."""
    from . import SimPolicy, closed_batch, efficiency_at_request
    workload, about = load_workload(args)
    jobs = closed_batch(workload.jobs) if args.closed_batch else list(workload.jobs)
    # How efficiently the users' own sizes use the cores under this model (before any regime
    # changes the asks): a model under which it is low makes shrinking look free.
    about["efficiency_at_request"] = round(efficiency_at_request(jobs), 4)
    print(f"efficiency at the requested size (core-second weighted): "
          f"{about['efficiency_at_request']:.3f}")
    policies = list(SimPolicy) if args.policy == "all" else [SimPolicy(args.policy)]
    results = []
    print(f"{'policy':12s} {'makespan s':>11s} {'bound s':>11s} {'mean resp s':>11s} "
          f"{'p95 wait s':>11s} {'mean bsld':>9s} {'util':>5s} {'resizes':>8s} {'wall s':>6s}")
    for policy in policies:
        r = simulate_regime(args, policy, jobs)
        results.append({**r.summary(), "seed": args.seed,
                        "malleable_fraction": args.malleable_fraction,
                        "malleable_ask": args.malleable_ask, "closed_batch": args.closed_batch,
                        "workload": args.swf or "generated", "jobs_read": workload.read,
                        "jobs_dropped": dict(workload.dropped),
                        "jobs_adjusted": dict(workload.adjusted), **about})
        print(f"{policy.value:12s} {r.makespan_s:11.0f} {r.lower_bound_makespan_s:11.0f} "
              f"{r.mean_response_s:11.0f} {r.p95_wait_s:11.0f} {r.mean_bounded_slowdown:9.2f} "
              f"{r.utilisation:5.3f} {r.resizes:8d} {r.wall_s:6.1f}")
    add_ratios(results, policies)
    if args.json:
        Path(args.json).write_text(json.dumps(results[0] if len(results) == 1 else results,
                                              indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """0 done, 1 could not be done (one line on stderr), 2 a usage error (argparse's exit)."""
    try:
        import numpy  # noqa: F401  (the engine's backfill search holds its reservations in it)
    except ImportError:
        print(f"malleable-sim: {NEEDS_NUMPY}", file=sys.stderr, flush=True)
        return 1
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (ValueError, OSError) as exc:
        # What the world or the arguments got wrong: one line. Anything else is a bug and
        # keeps its traceback.
        print(f"malleable-sim: {error_text(exc)}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
