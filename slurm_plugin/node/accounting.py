"""Accounting of borrowed and lent cores: per job and node, the core-seconds the job held above
its Slurm allocation (borrowed) and below it (lent).

A job's cpuset changes only when a reconcile cycle writes it (the agent's, or a hook's: the
Prolog's, a step start's), so its width (the cores it holds) is a step function of time, known
exactly at each write. ``account`` integrates the width recorded at the last write over the
time since, then records the new one:

    borrowed = integral of max(0, width - allocation) dt
    lent     = integral of max(0, allocation - width) dt

so ``borrowed - lent`` is the integral of the width minus the allocation. The usage of the jobs
running on a node lives in the node's ledger (it survives agent restarts); the Epilog closes a
job's usage up to its end and writes it as one ``job-usage`` line in the node's event log, where
a site's accounting can pick it up, and removes it from the ledger.

``account``, ``account_cycle``, ``held_after`` and ``usage_line`` are pure; ``record_cycle``
(the reconciler, once a cycle, under the node's lock) and ``close_job`` (the Epilog, under the
lock) also save and log.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping

from malleable_policy.model import NodeSnapshot, Outcome, OutcomeStatus
from slurm_plugin.feed.store import FeedStore

from slurm_plugin.node.core_usage import CoreUsage
from slurm_plugin.node.events import append_event
from slurm_plugin.node.ledger import Ledger, LedgerFile

def account(usage: CoreUsage | None, held: int, allocation: int, now: float) -> CoreUsage:
    """``usage`` integrated up to ``now`` with the width it recorded (what the job held since
    its last observation), then the job's new width ``held`` and ``allocation`` recorded from
    ``now`` on. ``None``: the job's first observation (nothing to integrate yet). A clock set
    back (``now`` before the last observation) integrates nothing and starts again from
    ``now``."""
    if held < 0 or allocation < 0:
        raise ValueError(f"negative cores: held {held}, allocation {allocation}")
    if usage is None:
        return CoreUsage(allocation=allocation, width=held, since=now, start=now)
    dt = now - usage.since
    if not dt > 0 or not math.isfinite(dt):
        return replace(usage, allocation=allocation, width=held, since=now)
    over = usage.width - usage.allocation
    return replace(usage, allocation=allocation, width=held, since=now,
                   borrowed_core_s=usage.borrowed_core_s + max(0, over) * dt,
                   lent_core_s=usage.lent_core_s + max(0, -over) * dt)


def so_far(usage: CoreUsage, now: float) -> CoreUsage:
    """``usage`` integrated up to ``now`` (the job still holds its recorded width)."""
    return account(usage, usage.width, usage.allocation, now)


def held_after(snapshot: NodeSnapshot, outcomes: list[Outcome]) -> dict[int, tuple[int, int]]:
    """Job id -> (cores held after the cycle, cores of its allocation), for every job whose
    cgroup folder exists: the applied action's ``after``, else what it held when observed (an
    action that failed or was cancelled left it there; a job Slurm has not made a folder for
    holds nothing yet)."""
    applied = {o.action.job_id: o.action.after for o in outcomes
               if o.status is OutcomeStatus.APPLIED}
    return {j.job_id: (len(applied.get(j.job_id, j.current)), len(j.allocation))
            for j in snapshot.jobs if j.has_folder}


def account_cycle(usage: Mapping[int, CoreUsage], held: Mapping[int, tuple[int, int]],
                  now: float) -> tuple[dict[int, CoreUsage], dict[int, CoreUsage]]:
    """One cycle's accounting: (the usage of every job in ``held``, integrated up to ``now``
    and recording its new width; the usage of the jobs no longer seen, whose Epilog did not
    close it: closed at their last observation, nothing integrated past it)."""
    running = {job_id: account(usage.get(job_id), h, a, now)
               for job_id, (h, a) in sorted(held.items())}
    gone = {job_id: u for job_id, u in usage.items() if job_id not in held}
    return running, gone


def hand_to_watcher(feed_dir: Path, job_id: int, line: dict[str, Any]) -> str | None:
    """A job's usage line on this node into the node's feed folder, for the watcher (which sums
    the nodes' once the job ended everywhere and writes it into Slurm's accounting); on a
    feed link the link takes it from there. Returns what went wrong, or None."""
    try:
        FeedStore(feed_dir).write_usage(job_id, line["node"],
                                        json.dumps(line, sort_keys=True).encode())
    except (OSError, ValueError) as exc:
        return f"job {job_id}: usage not handed to the watcher: {exc}"
    return None


def usage_line(job_id: int, node: str, usage: CoreUsage, *, end: float, closed_by: str,
               now: float | None = None) -> dict[str, Any]:
    """The job's ``job-usage`` event line (the site's accounting reads these)."""
    return {"time": end if now is None else now, "event": "job-usage", "job": job_id,
            "node": node, "allocation": usage.allocation,
            "borrowed_core_s": round(usage.borrowed_core_s, 3),
            "lent_core_s": round(usage.lent_core_s, 3),
            "start": usage.start, "end": end, "closed_by": closed_by}


def record_cycle(ledger_file: "LedgerFile", ledger: "Ledger", result, now: float,
                 log_event: Callable[[dict], None],
                 hand_over: Callable[[int, dict], None] = lambda job_id, line: None,
                 ) -> dict[int, CoreUsage]:
    """The reconciler's accounting, once a cycle after the executor ran, under the node's lock:
    every job's usage integrated up to ``now`` with the width it held since the last cycle and
    recording the width it holds now, the ledger saved, a ``job-usage`` line logged for every
    job gone without an Epilog closing its usage (its folder went: the Epilog failed or never
    ran, or the job's folder went first, as after scancel), and that line handed to the
    watcher (``hand_over``), as the Epilog does. Returns the running jobs' usage (the
    metrics')."""
    running, gone = account_cycle(ledger.usage, held_after(result.snapshot, result.outcomes),
                                  now)
    ledger.usage = running
    ledger_file.save(ledger)
    for job_id, u in sorted(gone.items()):
        line = usage_line(job_id, result.snapshot.node, u, end=u.since, closed_by="agent",
                          now=now)
        log_event(line)
        hand_over(job_id, line)
    return running


def close_job(ledger: "Ledger", job_id: int, node: str, end: float, event_log: Path,
              ) -> dict[str, Any] | None:
    """The Epilog's accounting, under the node's lock, before it saves the ledger: the job's
    usage integrated up to ``end`` with the width it last held, removed from the ledger, and
    written as one ``job-usage`` line to the node's event log (returned). None when the job's
    cgroup folder was never seen on the node (it held exactly its allocation: nothing borrowed
    or lent). Never raises: the Epilog must mark the job ended whatever happens here; a line
    that cannot be written goes to stderr (slurmd's log)."""
    try:
        usage = ledger.usage.pop(job_id, None)
        if usage is None:
            return None
        line = usage_line(job_id, node, so_far(usage, end), end=end, closed_by="epilog")
    except Exception as exc:  # noqa: BLE001 - the job is marked ended whatever happens here
        print(f"malleable epilog: job {job_id}: no usage: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return None
    text = json.dumps(line, sort_keys=True)
    try:
        append_event(event_log, text)
    except Exception as exc:  # noqa: BLE001
        print(f"malleable epilog: cannot write the event log ({type(exc).__name__}: {exc}): "
              f"{text}", file=sys.stderr)
    return line
