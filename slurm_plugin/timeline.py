"""The timeline a person looks at: each node's cores per job over time, stacked, so a job whose
line would hide behind another's shows, and the node's total (what is lent and borrowed) is the
top of the stack. ``demo-timeline.png`` is drawn from it, and ``malleable timeline`` draws the
same for any job from the agents' event logs (``samples_from_events``).

A sample is ``{"t": seconds, "job": id, "node": name, "cores": n}``, one per job and node each
time they are observed; a job keeps its last count until its next sample and has none before its
first, or after the node stops reporting it (then it counts 0 from the first time the node is
observed without it).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from malleable_protocol.cpulist import parse_cpu_list

RESIZES = ("grow", "shrink", "move")    # the agent's events that change a job's cores


def _cores(text: object) -> int | None:
    try:
        return len(parse_cpu_list(str(text)))
    except ValueError:
        return None


def samples_from_events(lines: Iterable[str], jobs: Sequence[int] = ()) -> list[dict]:
    """Samples from agents' event logs (one JSON object a line; a line that is not one of
    theirs is skipped): a job is on a node from its start at its allocation (its ``job-usage``
    line, written at its end; a job still running shows from its first resize), each applied
    resize sets its cores, and it leaves at its end. Every change observes every job then on the node. With ``jobs``, only the nodes
    they ran on, over their time there, with every job that shared those nodes meanwhile (whose
    lines would otherwise hide). Times are seconds from the first sample."""
    changes: dict[str, list[tuple[float, int, int | None]]] = {}   # node: (t, job, cores/None)
    for line in lines:
        try:
            e = json.loads(line)
            node, job = str(e["node"]), int(e["job"])
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if e.get("event") in RESIZES and e.get("status") == "applied":
            after = _cores(e.get("after"))
            try:
                t = float(e["time"])
            except (ValueError, KeyError, TypeError):
                continue
            if after is not None:
                changes.setdefault(node, []).append((t, job, after))
        elif e.get("event") == "job-usage":
            try:
                start, end, alloc = float(e["start"]), float(e["end"]), int(e["allocation"])
            except (ValueError, KeyError, TypeError):
                continue
            changes.setdefault(node, []).extend([(start, job, alloc), (end, job, None)])
    wanted = set(jobs)
    out: list[dict] = []
    for node, items in changes.items():
        items.sort(key=lambda c: (c[0], c[2] is not None))   # an end before a start at one time
        if wanted:
            mine = [t for t, j, _ in items if j in wanted]
            if not mine:
                continue
            lo, hi = min(mine), max(mine)
        live: dict[int, int] = {}
        for t, job, cores in items:
            ended = cores is None and live.pop(job, None) is not None
            if cores is not None:
                live[job] = cores
            if not wanted or lo <= t <= hi:
                # The job that ended shows 0 there: the end of its band.
                out.extend({"t": t, "job": j, "node": node, "cores": n}
                           for j, n in sorted({**live, **({job: 0} if ended else {})}.items()))
    if out:
        t0 = min(s["t"] for s in out)
        for s in out:
            s["t"] = round(s["t"] - t0, 3)
    return out


def stacked(samples: Sequence[Mapping], node: str, jobs: Sequence[int]
            ) -> tuple[list[float], dict[int, list[int]]]:
    """The node's observation times and, for each job, its cores at each of them."""
    here = [s for s in samples if s["node"] == node]
    times = sorted({float(s["t"]) for s in here})
    at: dict[float, dict[int, int]] = {t: {} for t in times}
    for s in here:
        at[float(s["t"])][int(s["job"])] = int(s["cores"])
    out: dict[int, list[int]] = {j: [] for j in jobs}
    for t in times:
        for j in jobs:
            out[j].append(at[t].get(j, 0))
    return times, out


def plot_stacked(samples: Sequence[Mapping], names: Mapping[int, str], png: Path, *,
                 cores_per_node: int | None, title: str) -> None:
    """One panel per node: the jobs' cores stacked (step-wise), in the order of ``names``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    nodes = sorted({s["node"] for s in samples})
    jobs = list(names)
    fig, axes = plt.subplots(max(1, len(nodes)), 1, figsize=(8, 2.2 * max(1, len(nodes))),
                             sharex=True, squeeze=False)
    colors = {j: f"C{i}" for i, j in enumerate(jobs)}
    for ax, node in zip(axes[:, 0], nodes):
        times, cores = stacked(samples, node, jobs)
        shown = [j for j in jobs if any(cores[j])]
        if times and shown:
            ax.stackplot(times, [cores[j] for j in shown], step="post",
                         labels=[f"job {j}" if names[j] == str(j) else f"job {names[j]} ({j})"
                                 for j in shown],
                         colors=[colors[j] for j in shown], alpha=0.85)
        if cores_per_node is not None:     # more above it: oversubscribed
            ax.axhline(cores_per_node, color="k", lw=0.8, ls="--")
        ax.set_ylabel(f"{node}\ncores")
        top = max([cores_per_node or 1] + [sum(c[i] for c in cores.values())
                                           for i in range(len(times))])
        ax.set_ylim(0, top + 0.5)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
