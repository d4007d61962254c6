"""The pure half of the replay of a trace on real Slurm (``benchmarks/cluster/slurm_replay.py`` runs
the cluster): the slice of a log and its compression in time (limits rounded up to Slurm's whole
minutes), the simulator's run of the same jobs, the per-job start-time error, and reading what
slurmctld wrote (its log, its job-completion log, the backfill cadence)."""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Iterable, Mapping, Sequence

from .config import Backfill, Placement, QueueOrder, SimPolicy, SlurmPass
from .engine import simulate
from .metrics import percentile
from .swf import SWFLog
from .workload import Amdahl, SimJob, swf_workload

LAUNCH_MARGIN_S = 2.0       # added to a compressed limit before rounding up to minutes
BF_MAX_JOB_TEST = 500       # Slurm's default, and the simulator's
BATCH_SCHED_DELAY_S = 3.0   # Slurm's default, and the simulator's


# --- the slice and its compression (pure) --------------------------------------------------------

@dataclass(frozen=True)
class ReplayJob:
    """One job as replayed: ``index`` 1.. in submission order; times in replay seconds."""

    index: int
    trace_job: int          # the job number in the log
    submit_s: float         # from the slice's first submit, divided by the factor
    procs: int
    sleep_s: float          # run time / factor
    limit_min: int          # Slurm's -t: whole minutes
    trace_run_s: float
    trace_limit_s: float    # requested time (or run time, see swf_workload), uncompressed

    @property
    def limit_s(self) -> float:
        return 60.0 * self.limit_min


def slice_jobs(log: SWFLog, start: int, count: int, *, nodes: int, cores: int
               ) -> tuple[list[SimJob], dict]:
    """Lines ``start`` .. ``start + count`` of the log as the simulator reads them
    (``swf_workload``: requested processors, requested time as limit, drops counted by reason),
    in submission order, with what was dropped or adjusted."""
    if start < 0 or count < 1 or start + count > len(log.records):
        raise ValueError(f"lines {start}..{start + count} are not within the log's "
                         f"{len(log.records)} lines")
    wl = swf_workload(SWFLog(log.header, log.records[start:start + count]), nodes=nodes,
                      cores=cores)
    return list(wl.jobs), {"dropped": dict(wl.dropped), "adjusted": dict(wl.adjusted)}


def limit_minutes(limit_s: float, factor: float, margin_s: float = LAUNCH_MARGIN_S) -> int:
    """Slurm's -t for a compressed limit: limit / factor + margin, rounded up to whole
    minutes, at least one."""
    return max(1, math.ceil((limit_s / factor + margin_s) / 60.0 - 1e-9))


def compress(jobs: Sequence[SimJob], factor: float, *,
             margin_s: float = LAUNCH_MARGIN_S) -> list[ReplayJob]:
    """Every time divided by ``factor``, the submit times from the first job's; run times kept
    to the millisecond (sleep takes fractions), limits in whole minutes (``limit_minutes``)."""
    if factor <= 0:
        raise ValueError("the compression factor must be positive")
    jobs = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
    first = jobs[0].submit_s
    return [ReplayJob(index=i, trace_job=j.job_id,
                      submit_s=round((j.submit_s - first) / factor, 3), procs=j.cores,
                      sleep_s=round(j.runtime_s / factor, 3),
                      limit_min=limit_minutes(j.expected_s, factor, margin_s),
                      trace_run_s=j.runtime_s, trace_limit_s=j.expected_s)
            for i, j in enumerate(jobs, 1)]


def rounding_report(jobs: Sequence[ReplayJob], factor: float) -> dict:
    """What rounding limits up to whole minutes did: each limit over its exact compressed
    value (trace limit / factor), and how many jobs sit on the one-minute floor."""
    raised = [j.limit_s / (j.trace_limit_s / factor) if j.trace_limit_s > 0 else math.inf
              for j in jobs]
    finite = [r for r in raised if math.isfinite(r)]
    exact_ratio = [j.trace_limit_s / j.trace_run_s for j in jobs if j.trace_run_s > 0]
    replay_ratio = [j.limit_s / j.sleep_s for j in jobs if j.sleep_s > 0]
    counts: dict[int, int] = {}
    for j in jobs:
        counts[j.limit_min] = counts.get(j.limit_min, 0) + 1
    return {
        "limit_minutes_count": {str(k): v for k, v in sorted(counts.items())},
        "at_one_minute": counts.get(1, 0),
        "limit_raised_median_x": statistics.median(finite) if finite else None,
        "limit_raised_p90_x": percentile(finite, 90) if finite else None,
        "limit_over_run_median_trace": statistics.median(exact_ratio) if exact_ratio else None,
        "limit_over_run_median_replay": statistics.median(replay_ratio) if replay_ratio else None,
        "sleeps_under_1s": sum(j.sleep_s < 1.0 for j in jobs),
    }


def sim_jobs(jobs: Iterable[ReplayJob], *, submit: Mapping[int, float] | None = None,
             runtime: Mapping[int, float] | None = None) -> list[SimJob]:
    """The replayed jobs as the simulator's (rigid, static: the speedup curve plays no part):
    job id = replay index, the rounded limit as time limit. ``submit``/``runtime`` replace a
    job's submit time or run time by index (the measured ones)."""
    submit, runtime = submit or {}, runtime or {}
    return [SimJob(j.index, submit.get(j.index, j.submit_s), j.procs,
                   max(0.0, runtime.get(j.index, j.sleep_s)), Amdahl(),
                   time_limit_s=j.limit_s)
            for j in jobs]


def run_sim(jobs: Sequence[SimJob], *, nodes: int, cores: int, bf_interval_s: float,
            placement: Placement = Placement.SLURM_TASKS, cadence: Cadence | None = None,
            slurm_pass: SlurmPass | None = None):
    """The simulator's static run. ``placement``: SLURM_TASKS is what ``sbatch -n P`` gets
    from select/cons_tres (a job that no node holds now is spread); ONE_NODE, the stand-in's
    earlier rule (it waits for one node), is reported beside it. ``cadence``: the backfill
    passes where Slurm's log puts them (measured); else every bf_interval from the replay's
    start. The main scheduler keeps Slurm's default batch_sched_delay (3 s), as the cluster
    does. ``slurm_pass``: Slurm 22.05's own backfill pass instead of the stand-in's."""
    return simulate(jobs, nodes=nodes, cores=cores, policy=SimPolicy.STATIC,
                    backfill=Backfill.CONSERVATIVE, backfill_depth=BF_MAX_JOB_TEST,
                    backfill_interval_s=cadence.period_s if cadence else bf_interval_s,
                    backfill_phase_s=cadence.phase_s if cadence else 0.0,
                    batch_sched_delay_s=BATCH_SCHED_DELAY_S,
                    queue_order=QueueOrder.FCFS, placement=placement, slurm_pass=slurm_pass)


def auto_factor(jobs: Sequence[SimJob], *, nodes: int, cores: int, target_s: float) -> int:
    """The factor that makes the simulated makespan of the uncompressed slice last
    ``target_s`` (whole number, at least 1). Planned with the one-node placement, as the
    replay of record was (so that ``--from-raw`` compresses the slice as it was replayed)."""
    res = run_sim(jobs, nodes=nodes, cores=cores, bf_interval_s=30.0,
                  placement=Placement.ONE_NODE)
    return max(1, round(res.makespan_s / target_s))


# --- the comparison (pure) -----------------------------------------------------------------------

@dataclass(frozen=True)
class Times:
    submit_s: float
    start_s: float
    end_s: float

    @property
    def wait_s(self) -> float:
        return self.start_s - self.submit_s


def schedule_metrics(times: Mapping[int, Times]) -> dict:
    """Mean wait, mean response (submit to end), p95 wait, and makespan (first submit to last
    end) of one schedule."""
    rows = list(times.values())
    if not rows:
        raise ValueError("no jobs")
    waits = [t.wait_s for t in rows]
    return {"jobs": len(rows), "mean_wait_s": statistics.fmean(waits),
            "p95_wait_s": percentile(waits, 95),
            "mean_response_s": statistics.fmean(t.end_s - t.submit_s for t in rows),
            "makespan_s": max(t.end_s for t in rows) - min(t.submit_s for t in rows)}


def summary_of(errors: dict) -> dict:
    """``start_errors``'s result without its per-job entries (what the JSON's summaries keep)."""
    return {k: v for k, v in errors.items() if k != "per_job_relative"}


def start_errors(sim: Mapping[int, Times], real: Mapping[int, Times], *, floor_s: float,
                 span_s: float | None = None) -> dict:
    """Per-job start-time error of ``sim`` against ``real`` (the jobs both hold):
    ``relative``  |start_sim - start_real| / max(real wait, floor_s), the headline;
    ``span``      the same over the replay's span (default: real makespan);
    ``abs_s``     the absolute error. Median and p90 of each; ``within_10pct`` the share of
    jobs whose relative error is at most 0.10; ``waited`` the same restricted to the jobs that
    waited longer than the floor in real Slurm."""
    if floor_s <= 0:
        raise ValueError("the floor must be positive")
    ids = sorted(set(sim) & set(real))
    if not ids:
        raise ValueError("no job in both schedules")
    if span_s is None:
        span_s = schedule_metrics({i: real[i] for i in ids})["makespan_s"]
    abs_err = {i: abs(sim[i].start_s - real[i].start_s) for i in ids}
    rel = {i: abs_err[i] / max(real[i].wait_s, floor_s) for i in ids}
    waited = [i for i in ids if real[i].wait_s > floor_s]

    def stats(values: list[float]) -> dict:
        if not values:
            return {"n": 0}
        return {"n": len(values), "median": statistics.median(values),
                "p90": percentile(values, 90), "mean": statistics.fmean(values),
                "max": max(values)}

    return {
        "floor_s": floor_s, "span_s": span_s,
        "relative": stats(list(rel.values())),
        "relative_waited": stats([rel[i] for i in waited]),
        "span": stats([abs_err[i] / span_s for i in ids]),
        "abs_s": stats(list(abs_err.values())),
        "within_10pct": sum(rel[i] <= 0.10 for i in ids) / len(ids),
        "within_10pct_waited": (sum(rel[i] <= 0.10 for i in waited) / len(waited)
                                if waited else None),
        "per_job_relative": {str(i): rel[i] for i in ids},
    }


# --- what Slurm wrote (pure) ---------------------------------------------------------------------

_STAMP = r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\] "
_SUBMIT = re.compile(_STAMP + r"_slurm_rpc_submit_batch_job: JobId=(\d+) ")
_MAIN = re.compile(_STAMP + r"sched: Allocate JobId=(\d+) NodeList=(\S+) #CPUs=(\d+)")
_BACKFILL = re.compile(_STAMP + r"(?:sched/)?backfill: (?:_start_job: )?Started JobId=(\d+) "
                       r"in \S+ on (\S+)")
_DONE = re.compile(_STAMP + r"_job_complete: JobId=(\d+) done")


def _epoch(stamp: str) -> float:
    """slurmctld's log time (local, ISO 8601 with milliseconds) as seconds since the epoch."""
    return datetime.fromisoformat(stamp).timestamp()


@dataclass
class CtldJob:
    submit: float | None = None
    start: float | None = None
    end: float | None = None
    how: str | None = None      # "main" (the main scheduler or at submit) or "backfill"
    nodes: str | None = None


def parse_ctld_log(text: str) -> dict[int, CtldJob]:
    """Each job's submit, start and end (epoch seconds, millisecond resolution) and which
    scheduler started it, from slurmctld's log at the info level (Slurm 22.05's lines)."""
    jobs: dict[int, CtldJob] = {}
    for line in text.splitlines():
        if m := _SUBMIT.match(line):
            jobs.setdefault(int(m[2]), CtldJob()).submit = _epoch(m[1])
        elif m := _MAIN.match(line):
            j = jobs.setdefault(int(m[2]), CtldJob())
            j.start, j.how, j.nodes = _epoch(m[1]), "main", m[3]
        elif m := _BACKFILL.match(line):
            j = jobs.setdefault(int(m[2]), CtldJob())
            j.start, j.how, j.nodes = _epoch(m[1]), "backfill", m[3]
        elif m := _DONE.match(line):
            jobs.setdefault(int(m[2]), CtldJob()).end = _epoch(m[1])
    return jobs


@dataclass(frozen=True)
class Cadence:
    """Slurm's backfill passes as its log shows them: at ``phase_s + k * period_s``."""
    phase_s: float
    period_s: float
    passes_seen: int
    max_residual_s: float


def fit_cadence(starts: Iterable[float], interval_s: float) -> Cadence:
    """The cadence of the passes that started jobs: starts less than half an interval apart
    are one pass (at its first start); each pass is numbered from the first by its gap in
    whole intervals (passes that started nothing in between), then phase and period by least
    squares. Slurm sleeps bf_interval after each pass, so the period is a little over it."""
    seen: list[float] = []
    for t in sorted(starts):
        if not seen or t - seen[-1] >= interval_s / 2:
            seen.append(t)
    if len(seen) < 2:
        raise ValueError("fewer than two backfill passes in the log")
    ks = [0]
    for a, b in zip(seen, seen[1:]):
        ks.append(ks[-1] + max(1, round((b - a) / interval_s)))
    n, mk, mt = len(seen), statistics.fmean(ks), statistics.fmean(seen)
    period = (sum((k - mk) * (t - mt) for k, t in zip(ks, seen))
              / sum((k - mk) ** 2 for k in ks))
    phase = mt - period * mk
    residual = max(abs(t - (phase + period * k)) for k, t in zip(ks, seen))
    return Cadence(phase, period, n, residual)


_JOBCOMP_FIELD = re.compile(r"(\w+)=(\S*)")


def parse_jobcomp(text: str) -> dict[int, dict[str, str]]:
    """jobcomp/filetxt's lines (``JobId=5 ... StartTime=2026-01-01T10:00:00 ...``) by job id."""
    out = {}
    for line in text.splitlines():
        fields = dict(_JOBCOMP_FIELD.findall(line))
        if "JobId" in fields:
            out[int(fields["JobId"])] = fields
    return out


# --- the replay on a real cluster ----------------------------------------------------------------

def scheduler_parameters(bf_interval_s: int) -> str:
    """Slurm's backfill as the simulator has it: its interval, its depth (Slurm's default,
    written out), and plans at one-second resolution (Slurm's default bf_resolution is 60 s,
    which would round every compressed start to a minute)."""
    return f"bf_interval={bf_interval_s},bf_max_job_test={BF_MAX_JOB_TEST},bf_resolution=1"


def real_times(jobs: Sequence[ReplayJob], raw: dict) -> tuple[dict[int, Times], dict[int, dict]]:
    """Each job's real submit, start and end in replay seconds (slurmctld's log), and what else
    is known of it (scheduler, nodes, jobcomp's whole-second start)."""
    t0 = raw["t0"]
    ctld = parse_ctld_log(raw["ctld_log"])
    comp = parse_jobcomp(raw["jobcomp_log"])
    times, info = {}, {}
    for j in jobs:
        sub = raw["submitted"].get(j.index)
        c = ctld.get(sub["job_id"]) if sub else None
        if c is None or c.start is None or c.end is None:
            continue
        submit = c.submit - t0 if c.submit is not None else sub["sbatch_end"]
        times[j.index] = Times(submit, c.start - t0, c.end - t0)
        jc = comp.get(sub["job_id"], {})
        info[j.index] = {"job_id": sub["job_id"], "how": c.how, "nodes": c.nodes,
                         "state": jc.get("JobState"),
                         "jobcomp_start_s": (_epoch(jc["StartTime"]) - t0
                                             if "StartTime" in jc else None)}
    return times, info


def sim_times(result) -> dict[int, Times]:
    return {r.job_id: Times(r.submit_s, r.start_s, r.end_s) for r in result.per_job}


# --- the report ----------------------------------------------------------------------------------
