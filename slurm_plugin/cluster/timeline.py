"""The timeline a person looks at: each node's cores per job over time, stacked, so a job whose
line would hide behind another's shows, and the node's total (what is lent and borrowed) is the
top of the stack. ``demo-timeline.png`` is drawn from it.

A sample is ``{"t": seconds, "job": id, "node": name, "cores": n}``, one per job and node each
time they are observed; a job keeps its last count until its next sample and has none before its
first, or after the node stops reporting it (then it counts 0 from the first time the node is
observed without it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence


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
                 cores_per_node: int, title: str) -> None:
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
                         labels=[f"job {names[j]} ({j})" for j in shown],
                         colors=[colors[j] for j in shown], alpha=0.85)
        ax.axhline(cores_per_node, color="k", lw=0.8, ls="--")   # more above it: oversubscribed
        ax.set_ylabel(f"{node}\ncores")
        top = max([cores_per_node] + [sum(c[i] for c in cores.values())
                                      for i in range(len(times))])
        ax.set_ylim(0, top + 0.5)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
