"""Keras 3 multi-worker training (MultiWorkerMirroredStrategy, TensorFlow 2.21, no Horovod) on a
real 2-node cluster with its agents: how fast a resize reaches the workers, and steps/s at 1 and
2 cores per worker, the two sizes alternating in one job so the machine's drifts hit both alike.

Two jobs from the multi-worker batch template (examples/train_multiworker.py, a 2 x 1024-wide MLP
on 256 rows a step), one after the other in the same run, and plain TensorFlow between them:

- two_workers: a worker on each of 2 nodes. ``scontrol update Comment=malleable:cpus=N``
  alternates N = 1, 2 every ``--phase`` seconds; for each update, the time until both workers'
  status records show N threads. On this machine both nodes are slurmds on one 2-core host, so
  the two workers share the same two physical cores: at 2 cores each they cannot get more
  compute than at 1 each (1 each: 2 cores in all; 2 each: still 2 cores), and their steps/s
  ratio says so.
- one_worker: one worker (the same strategy and loop, a cluster of one) on one node, the same
  alternation: the speedup a worker gets from its second core when no other worker shares it.
- plain_tf: the same model and loop in plain TensorFlow (no malleable_tf, no strategy,
  mlp_plain.py) started on 1 core and on 2 (taskset), alternating, between the two jobs: what
  this machine gives a second core at that moment, the ratio the workers' are compared with.

    python -m benchmarks.framework.multiworker [--rounds 5] [--phase 8]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, RESULTS, machine, save

from malleable_protocol.cpulist import parse_cpu_list
from sbatch_templates import render
from slurm_plugin.cluster import LocalCluster, default_spec
from malleable_policy.model import Policy

KERAS3_PY = REPO / ".venv-keras3" / "bin" / "python"
TRAIN = REPO / "examples" / "train_multiworker.py"
WIDTH, BATCH = 1024, 256          # per worker: a 2 x 1024-wide MLP on 256 rows a step


def plain_tf(rounds: int, seconds: float) -> dict:
    """Plain TensorFlow's steps/s on 1 core and on 2, alternating."""
    rates: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(rounds):
        for cpus in (1, 2):
            out = subprocess.run(["taskset", "-c", "0" if cpus == 1 else "0-1", str(KERAS3_PY),
                                  "-m", "benchmarks.framework.mlp_plain",
                                  "--width", str(WIDTH), "--batch-size", str(BATCH),
                                  "--seconds", str(seconds)], capture_output=True, text=True,
                                 timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                raise RuntimeError(f"mlp_plain.py failed: {out.stderr[-2000:]}")
            rates[cpus].append(json.loads(line[0][7:])["steps_per_s"])
    at = {c: statistics.median(v) for c, v in rates.items()}
    return {"steps_per_s_at_1": round(at[1], 2), "steps_per_s_at_2": round(at[2], 2),
            "ratio_2_over_1": round(at[2] / at[1], 2),
            "runs": {c: [round(x, 2) for x in v] for c, v in rates.items()}}


def statuses(folder: Path) -> dict[int, dict]:
    out = {}
    for f in folder.glob("rank_*.json"):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        out[d["rank"]] = d
    return out


def wait_threads(folder: Path, workers: int, cpus: int, timeout: float) -> float:
    """Seconds until every worker's status shows ``cpus`` active intra-op threads."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        st = statuses(folder)
        if len(st) == workers and all(d["intra_active"] == cpus for d in st.values()):
            return time.monotonic() - t0
        time.sleep(0.01)
    raise TimeoutError(f"workers at {[d['intra_active'] for d in statuses(folder).values()]}, "
                       f"not {cpus}, after {timeout} s")


def run_job(cluster: LocalCluster, base: Path, name: str, nodes: list[str], rounds: int,
            phase_s: float) -> dict:
    env = {**os.environ, **cluster.env(), "TF_CPP_MIN_LOG_LEVEL": "2"}
    report, stop = base / f"{name}-report", base / f"{name}-stop"
    script = base / f"{name}.sh"
    script.write_text(render("multi-worker", {
        "python": str(KERAS3_PY), "launcher": str(KERAS3_PY.parent / "malleable-srun"),
        "program": str(TRAIN), "nodes": str(len(nodes)), "min_cpus": "1", "max_cpus": "2",
        "output": str(base / f"{name}.out"),
        "args": f"--epochs 100000 --steps 5 --width {WIDTH} --batch-size {BATCH} "
                f"--report {report} --until {stop}"}))
    job_id = int(subprocess.run(["sbatch", "--parsable", "-c1", "-w", ",".join(nodes),
                                 str(script)], env=env, check=True, capture_output=True,
                                text=True).stdout.strip().split(";")[0])
    folder = cluster.run_layout.job_dir(job_id)
    phases, latencies = [], {1: [], 2: []}
    try:
        deadline = time.monotonic() + 240
        while len(statuses(folder)) < len(nodes):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: workers did not start: "
                                   f"{(base / f'{name}.out').read_text()[-2000:]}")
            time.sleep(0.2)
        time.sleep(phase_s)                      # the first epochs (tracing) out of the way
        for _ in range(rounds):
            for cpus in (1, 2):
                subprocess.run(["scontrol", "update", f"JobId={job_id}",
                                f"Comment=malleable:cpus={cpus}"], env=env, check=True,
                               capture_output=True)
                latencies[cpus].append(wait_threads(folder, len(nodes), cpus, 30))
                start = time.time()
                time.sleep(phase_s)
                cores = {r: sorted(parse_cpu_list(d["allowed_cpus"]))
                         for r, d in statuses(folder).items()}
                phases.append({"cpus": cpus, "start": start, "end": time.time(),
                               "cores": cores})
    finally:
        stop.touch()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and subprocess.run(
                ["squeue", "-h", "-j", str(job_id)], env=env, capture_output=True,
                text=True).stdout.strip():
            time.sleep(0.5)
        subprocess.run(["scancel", str(job_id)], env=env, capture_output=True)
    epochs = {r: [json.loads(s) for s in (report / f"epochs-{r}.jsonl").read_text().splitlines()]
              for r in range(len(nodes))}
    rates: dict[int, dict[int, list[float]]] = {1: {}, 2: {}}
    for p in phases:
        for r, lines in epochs.items():
            # epochs wholly inside the phase, at the phase's thread count
            inside = [e["steps_per_s"] for e in lines if e["time"] - e["seconds"] >= p["start"]
                      and e["time"] <= p["end"] and e["intra_active"] == p["cpus"]]
            rates[p["cpus"]].setdefault(r, []).extend(inside)
    per_worker = {r: {f"steps_per_s_at_{c}": round(statistics.median(rates[c][r]), 2)
                      for c in (1, 2)} for r in epochs}
    for r, v in per_worker.items():
        v["ratio_2_over_1"] = round(v["steps_per_s_at_2"] / v["steps_per_s_at_1"], 2)
        v["epochs_counted"] = {c: len(rates[c][r]) for c in (1, 2)}
    return {"job": job_id, "nodes": nodes, "per_worker": per_worker,
            "resize_ms": {f"to_{c}": [round(x * 1000) for x in latencies[c]] for c in (1, 2)},
            "resize_p50_ms": round(statistics.median(latencies[1] + latencies[2]) * 1000),
            "cores_per_phase": [{"cpus": p["cpus"], "cores": p["cores"]} for p in phases[:2]],
            "phases": phases, "epochs": epochs}


def plot(data: dict) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, name in zip(axes, ("two_workers", "one_worker")):
        run = data[name]
        t0 = run["phases"][0]["start"]
        for p in run["phases"]:
            ax.axvspan(p["start"] - t0, p["end"] - t0, color="#ddeeff" if p["cpus"] == 2
                       else "#ffffff", lw=0)
        for r, lines in run["epochs"].items():
            pts = [(e["time"] - t0, e["steps_per_s"]) for e in lines if e["time"] >= t0]
            ax.plot([x for x, _ in pts], [y for _, y in pts], ".", ms=3, label=f"worker {r}")
        ax.set_title(f"{name}: shaded = 2 cores per worker")
        ax.set_xlabel("s")
        ax.set_ylabel("steps/s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = RESULTS / "multiworker.png"
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--phase", type=float, default=8.0)
    args = ap.parse_args()
    if not KERAS3_PY.exists():
        raise SystemExit("no .venv-keras3: scripts/setup.sh --keras3")
    base = Path(tempfile.mkdtemp(prefix="malleable-mw-", dir="/tmp"))
    base.chmod(0o1777)       # jobs write their reports here; munged wants the sticky bit
    c = LocalCluster(default_spec(base / "cluster", nodes=2, port_base=3817,
                                  node_prefix="mw", name="malleablemw"))
    try:
        c.up(agents=Policy.LEND_IDLE)
        data = {"machine": machine(), "rounds": args.rounds, "phase_s": args.phase,
                "two_workers": run_job(c, base, "two", ["mw1", "mw2"], args.rounds, args.phase),
                "plain_tf": plain_tf(args.rounds, args.phase),
                "one_worker": run_job(c, base, "one", ["mw1"], args.rounds, args.phase)}
    finally:
        c.down()
        shutil.rmtree(base, ignore_errors=True)
    path = save("multiworker", data)
    plot(data)
    for name in ("two_workers", "one_worker"):
        run = data[name]
        print(f"{name}: resize p50 {run['resize_p50_ms']} ms {run['resize_ms']}; "
              f"{run['per_worker']}; cores {run['cores_per_phase']}")
    print(f"plain_tf: {data['plain_tf']}")
    print("->", path)


if __name__ == "__main__":
    main()
