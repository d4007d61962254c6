"""The simulator against the real runs of run.py, on the same workload.

Each job of the reference workload becomes a SimJob: submitted when it was in the static run,
1 core, its start-up there (from submission to its first training step: dispatch, imports,
building the model; more cores do not shorten it), the runtime it trained there, and the speedup
curve its own telemetry measured in the malleable runs (steps/s at 1 and 2 threads; where a job
never ran at 2, no speedup is assumed). The simulator knows nothing of the malleable runtime's
own cost (a malleable job at 1 core runs a little slower than the plain one of the static run:
the fidelity table), nor of the agent's reaction time: both show up as the error. The
simulator (`malleable simulate`'s engine, the agent's own decide) then runs each regime on one
node of 2 cores; the error per metric is simulated / real - 1.

    python benchmarks/coscheduling/validate.py

Reads benchmarks/results/coscheduling.json; writes coscheduling_validation.json.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import RESULTS, save  # noqa: E402

from slurm_plugin.coscheduler.request import MalleableSpec  # noqa: E402
from slurm_plugin.simulator import Amdahl, Measured, SimJob, SimPolicy, simulate  # noqa: E402


def curves(runs: list[dict]) -> dict[str, dict[int, float]]:
    """Each job's steps/s by threads, the median over the malleable runs that measured it."""
    seen: dict[str, dict[int, list[float]]] = {}
    for run in runs:
        if run["job_mode"] != "malleable":
            continue
        for name, job in run["jobs"].items():
            for k, v in job["steps_per_s_by_threads"].items():
                seen.setdefault(name, {}).setdefault(int(k), []).append(v)
    return {name: {k: sorted(v)[len(v) // 2] for k, v in pts.items()}
            for name, pts in seen.items()}


def sim_jobs(real: dict) -> list[SimJob]:
    static = next(r for r in real["runs"] if r["regime"] == "static")
    measured = curves(real["runs"])
    out = []
    for i, (name, job) in enumerate(sorted(static["jobs"].items()), 1):
        pts = measured.get(name, {})
        curve = Measured.from_steps_per_s(pts) if pts else Amdahl(serial=1.0)  # no speedup
        spec = MalleableSpec(min_cpus=1, max_cpus=2) if job["malleable"] else None
        out.append(SimJob(i, job["submitted"], 1, job["end"] - job["ready"], curve, spec,
                          startup_s=job["ready"] - job["submitted"]))
    return out


def main() -> None:
    real = json.loads((RESULTS / "coscheduling.json").read_text())
    jobs = sim_jobs(real)
    rows = []
    for run in real["runs"]:
        sim = simulate(jobs, nodes=1, cores=2, policy=SimPolicy(run["regime"]))
        row = {"regime": run["regime"]}
        for metric in ("makespan_s", "mean_completion_s", "utilisation"):
            s, r = getattr(sim, metric), run[metric]
            row[metric] = {"real": round(r, 3), "simulated": round(s, 3),
                           "error": round(s / r - 1, 3)}
        rows.append(row)
        print(f"{run['regime']:12s} " + "  ".join(
            f"{m} real {row[m]['real']:.1f} sim {row[m]['simulated']:.1f} "
            f"({row[m]['error']:+.1%})" for m in ("makespan_s", "mean_completion_s")))
    gains = {}
    static = {r["regime"]: r for r in rows}.get("static")
    if static:
        for row in rows:
            g = {}
            for metric in ("makespan_s", "mean_completion_s"):
                real_gain = 1 - row[metric]["real"] / static[metric]["real"]
                sim_gain = 1 - row[metric]["simulated"] / static[metric]["simulated"]
                g[metric] = {"real": round(real_gain, 3), "simulated": round(sim_gain, 3),
                             "real / simulated": round(real_gain / sim_gain, 3)
                             if abs(sim_gain) > 1e-9 else None}
            gains[row["regime"]] = g
    save("coscheduling_validation", {
        "what": "the simulator on the reference workload with measured curves vs the real runs",
        "jobs": [{"job": j.job_id, "submit_s": j.submit_s, "startup_s": round(j.startup_s, 2),
                  "runtime_s": round(j.runtime_s, 2),
                  "malleable": j.spec is not None, "curve": repr(j.speedup)} for j in jobs],
        "rows": rows, "gain_vs_static": gains})


if __name__ == "__main__":
    main()
