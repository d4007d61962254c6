"""The simulator's stand-in for Slurm, out of sample (issue 43, item 7): what is fitted on one
replay (``slurm_replay.py``) predicts another slice's replay, which it never saw.

From the fitting replay A, three things are measured: the period of Slurm's backfill passes (its
log's cadence; slightly over bf_interval), the median launch-and-end overhead of a job (its end -
start - sleep) and the median submit lag (slurmctld's submit time - the planned one). The phase
of the passes is not: it is where slurmctld's clock happened to be when it started, different in
every run, so no trace can know it. The prediction for replay B is then made from B's trace
inputs only: every job submitted at its planned time plus A's lag and running its sleep plus
A's overhead, simulated at each of ``PHASES`` phases of A's period; a job's predicted start is
the median of its starts over the phases. Scored against B's real starts with the replay's own
error (|start_sim - start_real| over the real wait, floored at bf_interval).

Beside it: the same with A = B (in sample, the phase still unknown), and the earlier figure, the
median of the phases' own medians (one random phase, as a single simulation would have).

Each table is made twice: by the simulator's stand-in (what the traces run) and by Slurm 22.05's
own backfill pass (``SlurmPass``), whose 30 s barriers fall where slurmctld's clock happened to
be, spread over the phases like the cadence's phase; and once more with that clock read from
the scored replay's log (a diagnostic, not a prediction).

    python -m benchmarks.cluster.replay_out_of_sample [--runs slurm_replay,slurm_replay_kth3000,...]

Reads benchmarks/results/NAME.json and NAME_raw.json of each run; writes
benchmarks/results/slurm_replay_out_of_sample.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import re
import statistics
import time
from dataclasses import dataclass

from benchmarks.cluster.slurm_replay import PHASES, plan_jobs
from benchmarks.common import RESULTS, machine, save
from malleable_sim import Placement, SlurmPass
from malleable_sim.replay import (Cadence, ReplayJob, Times, fit_cadence, real_times, run_sim,
                                  sim_jobs, sim_times, start_errors, summary_of)

RUNS = ("slurm_replay", "slurm_replay_kth3000", "slurm_replay_kth12000")
GOAL = 0.15           # issue 43: out-of-sample median start error


@dataclass(frozen=True)
class Replay:
    """One replay as it was run: its planned jobs, what Slurm did, and its cluster."""
    name: str
    jobs: list[ReplayJob]
    real: dict[int, Times]
    info: dict[int, dict]
    nodes: int
    cores: int
    bf_interval_s: float
    placement: Placement
    ctld_clock_s: float      # slurmctld's clock at the replay's t = 0, modulo 30 s (its log's)


@dataclass(frozen=True)
class Fitted:
    """What one replay tells about Slurm on this machine."""
    period_s: float
    overhead_s: float
    submit_lag_s: float


def load(name: str) -> Replay:
    meta = json.loads((RESULTS / f"{name}.json").read_text())
    raw = json.loads((RESULTS / f"{name}_raw.json").read_text())
    raw["submitted"] = {int(k): v for k, v in raw["submitted"].items()}
    bf = re.search(r"bf_interval=(\d+)", meta["scheduler_parameters"])
    if bf is None:
        raise ValueError(f"{name}: no bf_interval in {meta['scheduler_parameters']!r}")
    jobs, _, _ = plan_jobs(meta["trace"], meta["slice_first_line"], meta["slice_lines"],
                           nodes=meta["cluster"]["nodes"], cores=meta["cluster"]["cpus_per_node"],
                           factor=float(meta["factor"]))
    real, info = real_times(jobs, raw)
    return Replay(name, jobs, real, info, meta["cluster"]["nodes"],
                  meta["cluster"]["cpus_per_node"], float(bf.group(1)),
                  Placement(meta["simulator"]["placement"]), raw["t0"] % 30.0)


def fit(r: Replay) -> Fitted:
    by_index = {j.index: j for j in r.jobs}
    cadence = fit_cadence([t.start_s for i, t in r.real.items()
                           if r.info[i]["how"] == "backfill"], r.bf_interval_s)
    return Fitted(
        period_s=cadence.period_s,
        overhead_s=statistics.median(t.end_s - t.start_s - by_index[i].sleep_s
                                     for i, t in r.real.items()),
        submit_lag_s=statistics.median(t.submit_s - by_index[i].submit_s
                                       for i, t in r.real.items()))


class Scheduler(enum.Enum):
    """What predicts Slurm: the simulator's stand-in (what the traces run) or Slurm 22.05's
    own backfill pass (``SlurmPass``: cons_tres's _will_run_test and _eval_nodes; too slow for
    the traces)."""
    STAND_IN = "stand-in"
    SLURM_PASS = "slurm-pass"


# Each variant scored: the scheduler, and whether slurmctld's clock is read from the scored
# replay's own log (a diagnostic: no prediction knows it).
VARIANTS = ((Scheduler.STAND_IN, False), (Scheduler.SLURM_PASS, False),
            (Scheduler.SLURM_PASS, True))


def clock_s(r: Replay, k: int, known: bool) -> float:
    """slurmctld's clock at the replay's t = 0, modulo 30 s (where its whole seconds and its
    30 s will-run barriers fall): where the clock happened to be, as unknown as the cadence's
    phase, so spread evenly over the phases alike; ``known``: read from the replay's log."""
    return r.ctld_clock_s if known else k * 30.0 / PHASES


def predict(r: Replay, f: Fitted, scheduler: Scheduler = Scheduler.STAND_IN,
            clock_known: bool = False) -> tuple[dict[int, Times], list[dict[int, Times]]]:
    """Each job's median start over the phases (its submit and end shifted alike), and each
    phase's own schedule."""
    jobs = sim_jobs(r.jobs, submit={j.index: j.submit_s + f.submit_lag_s for j in r.jobs},
                    runtime={j.index: j.sleep_s + f.overhead_s for j in r.jobs})
    phases = [sim_times(run_sim(jobs, nodes=r.nodes, cores=r.cores,
                                bf_interval_s=r.bf_interval_s, placement=r.placement,
                                cadence=Cadence(k * f.period_s / PHASES, f.period_s, 0, 0.0),
                                slurm_pass=SlurmPass(clock_s(r, k, clock_known))
                                if scheduler is Scheduler.SLURM_PASS else None))
              for k in range(PHASES)]
    median_start = {}
    for i, t in phases[0].items():
        start = statistics.median(p[i].start_s for p in phases)
        median_start[i] = Times(t.submit_s, start, start + (t.end_s - t.start_s))
    return median_start, phases


def score(fitted_on: Replay, scored_on: Replay, scheduler: Scheduler = Scheduler.STAND_IN,
          clock_known: bool = False) -> dict:
    f = fit(fitted_on)
    median_start, phases = predict(scored_on, f, scheduler, clock_known)
    floor = scored_on.bf_interval_s
    ensemble = start_errors(median_start, scored_on.real, floor_s=floor)
    one_phase = [start_errors(p, scored_on.real, floor_s=floor)["relative"]["median"]
                 for p in phases]
    return {"fitted_on": fitted_on.name, "scored_on": scored_on.name,
            "fitted": dataclasses.asdict(f),
            "median_over_phases": summary_of(ensemble),
            "one_phase_median_of_medians": statistics.median(one_phase),
            "one_phase_medians": [round(x, 4) for x in one_phase]}


def table(replays: list[Replay], scheduler: Scheduler, clock_known: bool) -> dict:
    """Every (fitted on, scored on) pair's score, and the out-of-sample summary."""
    label = f"[{scheduler.value}{', clock known' if clock_known else ''}]"
    pairs = []
    for a in replays:
        for b in replays:
            row = score(a, b, scheduler, clock_known)
            pairs.append(row)
            e = row["median_over_phases"]["relative"]
            print(f"{label} fitted on "
                  f"{a.name:24s} scored on {b.name:24s} median {e['median']:.3f} "
                  f"p90 {e['p90']:.2f} (one phase: {row['one_phase_median_of_medians']:.3f})",
                  flush=True)
    out_of_sample = [p["median_over_phases"]["relative"]["median"] for p in pairs
                     if p["fitted_on"] != p["scored_on"]]
    in_sample = [p["median_over_phases"]["relative"]["median"] for p in pairs
                 if p["fitted_on"] == p["scored_on"]]
    headline = statistics.median(out_of_sample) if out_of_sample else None
    print(f"{label} out of sample: median "
          f"of medians {headline} over {len(out_of_sample)} pairs "
          f"({min(out_of_sample, default=0):.3f}..{max(out_of_sample, default=0):.3f}); "
          f"goal <= {GOAL}", flush=True)
    return {"scheduler": scheduler.value, "clock_known": clock_known, "pairs": pairs,
            "out_of_sample_median_of_medians": headline,
            "out_of_sample_range": [min(out_of_sample, default=None),
                                    max(out_of_sample, default=None)],
            "in_sample_medians": in_sample,
            "goal_met": headline is not None and headline <= GOAL}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default=",".join(RUNS))
    args = ap.parse_args(argv)
    replays = [load(n) for n in args.runs.split(",")]
    t0 = time.monotonic()
    variants = {f"{s.value}{'+clock' if known else ''}": table(replays, s, known)
                for s, known in VARIANTS}
    save("slurm_replay_out_of_sample", {
        "what": "issue 43 item 7: what predicts Slurm, fitted on one replay (backfill period, "
                "launch overhead, submit lag) and scored on another, the phase unknown: each "
                "job's median start over the phases; the simulator's stand-in and Slurm "
                "22.05's own backfill pass (SlurmPass), the latter also with slurmctld's "
                "clock read from the scored replay (a diagnostic)",
        "machine": machine(), "runs": [r.name for r in replays], "phases": PHASES,
        "goal": GOAL, "variants": variants, "wall_s": round(time.monotonic() - t0, 1)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
