"""Fidelity of every control path, pinned or floating, and the overhead, against plain TensorFlow
side by side.

A malleable process starts with pools of M = the machine's cores on all of them, and is brought
to N active threads from outside through one control path; it is compared with a plain
TensorFlow process started with N intra-op and N inter-op threads, in the same placement:

    floating  the process may still run on every core:       api, signal
    pinned    the process runs on N cores (whoever put it there):
              api and signal (follow off; then taskset -a), target file (+ SIGUSR1),
              cpuset cgroup change, affinity change (taskset -a)
    overhead  N = M, nothing resized (path "none"), against plain TF with M threads

Every process of a group stays alive and they take turns: a burst of ``--seconds`` each, in
random order, round after round, the idle ones stopped (SIGSTOP), so the machine's slow drifts
hit all alike. Each round gives one ratio per path (malleable / plain steps/s). A process is lucky
or unlucky for its whole life here (an A/A run gave per-pair medians from 0.84 to 1.25), so each
group is started afresh ``--pairs`` times; the result is the median of all ratios with a
bootstrap 95% confidence interval that resamples whole pairs.

    python -m benchmarks.framework.fidelity [--pairs 5] [--rounds 3] [--seconds 1]
                                  [--groups floating,pinned,overhead] [--env K=V] [--name NAME]
                                  [--framework tensorflow|torch] [--workloads tf_data]

Writes benchmarks/results/NAME.json and NAME.png (NAME: fidelity, or fidelity_torch). --env sets
a variable in every worker, e.g. TF_ENABLE_ONEDNN_OPTS=0 to see what oneDNN's kernels
contribute. --framework torch measures malleable_torch against plain PyTorch started with N
threads (torch.set_num_threads at start), its workers run by .venv-torch's Python
(torch_worker.py, torch_workloads.py); PyTorch's inter-op pool is not managed, so only the
intra-op count is compared.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchmarks.common import (RESULTS, TF_WORKER, TORCH_PYTHON, TORCH_WORKER, BurstWorker,
                               CpusetFolder, machine, median, ratio_stats, save, take_turns)

from malleable_protocol import Target, format_cpu_list

WORKLOADS = ("keras_cnn", "matmul", "tf_data")


@dataclass(frozen=True)
class Framework:
    """Which framework's workers measure: their module, interpreter and workloads."""
    name: str
    worker: str
    python: str
    workloads: tuple[str, ...]
    plain_name: str
    distribution: str              # the installed distribution whose version is reported


FRAMEWORKS = {
    "tensorflow": Framework("tensorflow", TF_WORKER, sys.executable, WORKLOADS, "plain TF",
                            "tensorflow-cpu"),
    "torch": Framework("torch", TORCH_WORKER, str(TORCH_PYTHON),
                       ("mlp_train", "cnn_train", "matmul"), "plain PyTorch", "torch"),
}
GOALS = {"fidelity": 0.95, "overhead": 0.98}
# Signals for the signal path: one step down of each pool per signal.
SIGNAL_SPEC = "USR1=reload,USR2=intra-down,URG=inter-down"


def cpu_list(n: int) -> str:
    """The first n cores, as taskset and cpuset.cpus write them."""
    return format_cpu_list(frozenset(range(n)))


def taskset(pid: int, cpus: str) -> None:
    subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], check=True,
                   capture_output=True)


@dataclass
class Ctx:
    """What a resize needs: the sizes, and the folder for target files."""
    n: int
    m: int
    scratch: Path


@dataclass
class ControlPath:
    """One way to bring a malleable process from M to N active threads."""
    name: str
    pinned: bool
    args: Callable[[Ctx, dict], list[str]]   # extra tf_worker.py arguments (may make resources)
    resize: Callable[[Ctx, BurstWorker, dict], None]
    env: Callable[[Ctx], dict] = lambda ctx: {}


def _api(ctx: Ctx, w: BurstWorker, res: dict) -> None:
    w.send(f"API {ctx.n} {ctx.n}")
    if res.get("pin"):
        time.sleep(0.5)   # the API line is read before GO; pin once it has been applied
        taskset(w.pid, cpu_list(ctx.n))


def _signal(ctx: Ctx, w: BurstWorker, res: dict) -> None:
    # Standard signals do not queue: one at a time, each given time to be handled.
    for _ in range(ctx.m - ctx.n):
        for signo in (signal.SIGUSR2, signal.SIGURG):
            os.kill(w.pid, signo)
            time.sleep(0.3)
    if res.get("pin"):
        taskset(w.pid, cpu_list(ctx.n))


def _target(ctx: Ctx, w: BurstWorker, res: dict) -> None:
    path = ctx.scratch / f"target_{w.pid}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(Target(cpus=frozenset(range(ctx.n)), generation=1).encode())
    os.replace(tmp, path)
    os.kill(w.pid, signal.SIGUSR1)


def _cpuset_args(ctx: Ctx, res: dict) -> list[str]:
    res["cpuset"] = CpusetFolder(f"fid{len(res)}_{random.randrange(10**6)}", cpu_list(ctx.m))
    return ["--cgroup", str(res["cpuset"].path)]


PATHS = {
    "api floating": ControlPath("api", False, lambda c, r: [], _api),
    "signal floating": ControlPath("signal", False, lambda c, r: [], _signal,
                                   lambda c: {"MALLEABLE_TF_SIGNALS": SIGNAL_SPEC}),
    "api pinned": ControlPath("api", True, lambda c, r: r.update(pin=True) or ["--no-follow"],
                              _api),
    "signal pinned": ControlPath("signal", True,
                                 lambda c, r: r.update(pin=True) or ["--no-follow"], _signal,
                                 lambda c: {"MALLEABLE_TF_SIGNALS": SIGNAL_SPEC}),
    # _target sends SIGUSR1, as when the fidelity table's numbers were taken (docs/evaluation.md): the worker must map it.
    "target file": ControlPath("target", True, lambda c, r: [], _target,
                               lambda c: {"MALLEABLE_TF_TARGET": str(c.scratch / "target_{pid}.json"),
                                          "MALLEABLE_TF_SIGNALS": "USR1=reload"}),
    "cpuset": ControlPath("cpuset", True, _cpuset_args,
                          lambda c, w, r: r["cpuset"].set_cpus(cpu_list(c.n))),
    "affinity": ControlPath("affinity", True, lambda c, r: [],
                            lambda c, w, r: taskset(w.pid, cpu_list(c.n))),
}
GROUPS = {"floating": ["api floating", "signal floating"],
          "pinned": ["api pinned", "signal pinned", "target file", "cpuset", "affinity"]}


def run_group(paths: list[str], n: int, m: int, args, rng: random.Random,
              overhead: bool = False) -> dict[str, dict]:
    """Rates of each path's malleable process and of the group's plain one, over fresh pairs."""
    env = {"MALLEABLE_TF_LOG": "0", "TF_CPP_MIN_LOG_LEVEL": "2", **args.env}
    names = ["none"] if overhead else paths
    pinned = not overhead and PATHS[paths[0]].pinned
    # rates[name][pair] = [{workload: rate} per round]
    rates: dict[str, list[list[dict]]] = {k: [] for k in ["plain", *names]}
    states: dict[str, list[dict]] = {k: [] for k in names}
    for pair in range(args.pairs):
        scratch = Path(tempfile.mkdtemp(prefix="malleable-fid-"))
        ctx = Ctx(n, m, scratch)
        resources: dict[str, dict] = {k: {} for k in names}
        # TF started with N threads: intra, inter and tf.data's pool (plain TF otherwise runs
        # map calls on every core, whatever its thread settings).
        plain_args = ["plain", "--threads", str(m if overhead else n),
                      "--data-pool", str(m if overhead else n)]
        if pinned:
            plain_args += ["--cpus", cpu_list(n)]
        fw = args.fw
        workers = {"plain": BurstWorker([fw.worker, *plain_args], env=env, python=fw.python)}
        for k in names:
            extra, extra_env = [], {}
            if k != "none":
                extra = PATHS[k].args(ctx, resources[k])
                extra_env = PATHS[k].env(ctx)
            workers[k] = BurstWorker([fw.worker, "malleable", "--pool", str(m), "--expect",
                                      str(m if overhead else n), *extra],
                                     env={**env, **extra_env}, python=fw.python)
        try:
            workers["plain"].start(resize=lambda w: None)
            for k in names:
                how = (lambda w: None) if k == "none" else (
                    lambda w, k=k: PATHS[k].resize(ctx, w, resources[k]))
                states[k].append(workers[k].start(resize=how))
            for k, got in take_turns(workers, fw.workloads, args.rounds, args.seconds,
                                     rng).items():
                rates[k].append(got)
            print(f"N={n}/{m} pair {pair}: " + "; ".join(
                f"{k}: " + " ".join(
                    f"{wl} {ratio_stats([rates[k][pair]], [rates['plain'][pair]], wl)['median']:.2f}"
                    for wl in fw.workloads) for k in names), flush=True)
        finally:
            for w in workers.values():
                w.close()
            for r in resources.values():
                if "cpuset" in r:
                    r["cpuset"].remove()
            for f in scratch.iterdir():
                f.unlink()
            scratch.rmdir()
    out = {}
    for k in names:
        row = {"path": k, "pinned": pinned, "active": m if overhead else n, "pool": m,
               "goal": GOALS["overhead" if overhead else "fidelity"],
               "worker_state_when_ready": states[k][0], "workloads": {}}
        for wl in args.fw.workloads:
            row["workloads"][wl] = {
                **ratio_stats(rates[k], rates["plain"], wl),
                # Per CPU-second: where plain TF uses more cores than its thread settings say
                # (tf.data's own pool is sized by the cores, not by the inter-op threads).
                "per_cpu_second": ratio_stats(rates[k], rates["plain"], wl, "cpu"),
                "cores_used": {name: median([x[wl]["wall"] / x[wl]["cpu"] for p in rates[key]
                                             for x in p])
                               for name, key in (("malleable", k), ("plain", "plain"))},
                "steps_per_s": {"malleable": median([x[wl]["wall"] for p in rates[k] for x in p]),
                                "plain": median([x[wl]["wall"] for p in rates["plain"] for x in p])}}
        out[k if not overhead else "none (overhead)"] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per pair")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--groups", default="floating,pinned,overhead")
    ap.add_argument("--env", action="append", default=[], help="K=V for every worker")
    ap.add_argument("--name", help="default: fidelity (TensorFlow), fidelity_torch (PyTorch)")
    ap.add_argument("--framework", choices=sorted(FRAMEWORKS), default="tensorflow")
    ap.add_argument("--workloads", help="a subset of the framework's, e.g. tf_data")
    args = ap.parse_args()
    args.fw = FRAMEWORKS[args.framework]
    if args.workloads:
        chosen = tuple(args.workloads.split(","))
        unknown = set(chosen) - set(args.fw.workloads)
        if unknown:
            ap.error(f"--workloads: not {args.framework}'s: {', '.join(sorted(unknown))}")
        args.fw = dataclasses.replace(args.fw, workloads=chosen)
    args.name = args.name or ("fidelity" if args.framework == "tensorflow" else "fidelity_torch")
    args.env = dict(kv.split("=", 1) for kv in args.env)
    m = len(os.sched_getaffinity(0))
    rng = random.Random(1)
    rows: dict[str, dict] = {}
    for group in args.groups.split(","):
        if group == "overhead":
            rows.update(run_group([], m, m, args, rng, overhead=True))
            continue
        for n in range(1, m):
            rows.update({f"{k} N={n}" if m > 2 else k: v
                         for k, v in run_group(GROUPS[group], n, m, args, rng).items()})
    data = {"benchmark": "fidelity per control path", "framework": args.framework,
            "framework_version": framework_version(args.fw), "machine": machine(),
            "workloads": list(args.fw.workloads), "plain": args.fw.plain_name,
            "rounds_per_pair": args.rounds, "pairs": args.pairs,
            "seconds_per_burst": args.seconds, "goal": GOALS, "worker_env": args.env,
            "method": "a malleable process started with pools of M on all cores, resized to N "
                      f"from outside through the path, against {args.fw.plain_name} started "
                      "with N threads "
                      "in the same placement; interleaved bursts, idle workers SIGSTOPped; "
                      "ratio = malleable/plain steps/s per round; median of all rounds with a "
                      "bootstrap 95% CI resampling pairs of processes",
            "rows": rows}
    for name, row in rows.items():
        for wl, out in row["workloads"].items():
            lo, hi = out["ci95"]
            print(f"{name:18s} N={row['active']}/{row['pool']} {wl:9s}: {out['median']:.3f} "
                  f"(95% CI {lo:.3f}-{hi:.3f}), goal {row['goal']}")
    save(args.name, data)
    plot(data, args.name)


def framework_version(fw: Framework) -> str:
    return subprocess.run([fw.python, "-c", "import importlib.metadata as m; "
                           f"print(m.version({fw.distribution!r}))"],
                          capture_output=True, text=True).stdout.strip()


def plot(data: dict, name: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = data["rows"]
    names = list(rows)
    workloads = data.get("workloads", WORKLOADS)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    width = 0.8 / len(workloads)
    for i, wl in enumerate(workloads):
        xs = [j + (i - (len(workloads) - 1) / 2) * width for j in range(len(names))]
        meds = [rows[k]["workloads"][wl]["median"] for k in names]
        err = [[m - rows[k]["workloads"][wl]["ci95"][0] for m, k in zip(meds, names)],
               [rows[k]["workloads"][wl]["ci95"][1] - m for m, k in zip(meds, names)]]
        ax.bar(xs, meds, width, label=wl, yerr=err, capsize=3)
        for k, x in zip(names, xs):
            rs = rows[k]["workloads"][wl]["pair_medians"]
            ax.plot([x] * len(rs), rs, "k.", ms=3, alpha=0.6)
    ax.axhline(GOALS["fidelity"], color="r", ls="--", lw=1, label="fidelity goal 0.95")
    ax.axhline(GOALS["overhead"], color="m", ls=":", lw=1, label="overhead goal 0.98 (none)")
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([f"{k}\nN={rows[k]['active']}/{rows[k]['pool']}" for k in names],
                       fontsize=8)
    ax.set_ylabel(f"steps/s malleable / {data.get('plain', 'plain TF')} with N threads")
    env = " ".join(f"{k}={v}" for k, v in data["worker_env"].items())
    ax.set_title(f"Fidelity per control path ({data.get('framework', 'tensorflow')} "
                 f"{data.get('framework_version', '')}) {env}, interleaved bursts, "
                 f"{data['pairs']} fresh groups\n"
                 "(bars: median ratio, 95% CI over groups; dots: group medians)", fontsize=10)
    top = max(r for k in names for wl in workloads
              for r in rows[k]["workloads"][wl]["pair_medians"] + rows[k]["workloads"][wl]["ci95"])
    ax.set_ylim(0.5, max(1.3, top) + 0.15)
    ax.legend(fontsize=7, loc="upper center", ncol=5)
    fig.tight_layout()
    out = str(RESULTS / f"{name}.png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
