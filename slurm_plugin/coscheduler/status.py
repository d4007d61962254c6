"""``malleable status``: per malleable job and node, Slurm's cores, the current cores, the
bounds, each rank's active threads and steps/s. It reads only the feed folder (the watcher's
view of Slurm and each node agent's report): it works wherever that folder is mounted, and
costs slurmctld nothing.

Slurm's PrivateData=jobs: a user sees only his own jobs. The feed holds every user's, so it is
root's alone (``feed.store``): ``malleable status`` run by anyone else cannot read it and says so
(``FeedUnreadable``); where a site lets others read it anyway, a user other than root is shown
only the rows of his own jobs (``uid``) and no node's problems."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from malleable_protocol import format_cpu_list

from ..feed.store import FeedStore


@dataclass
class StatusRow:
    job_id: int
    user: str
    node: str
    slurm_cpus: str
    current_cpus: str
    bounds: str
    requested: int | None
    threads: list[int]
    steps_per_s: list[float]

    def to_dict(self) -> dict:
        return asdict(self)


class FeedUnreadable(Exception):
    """This user may not read the feed (anyone but root)."""


def check_feed(store: FeedStore) -> None:
    """Raises ``FeedUnreadable`` when there is no feed folder at all (a wrong ``--feed-dir``
    showed an empty table and exit 0) or when this process may not read it."""
    if not store.feed_dir.is_dir():
        raise FeedUnreadable(f"no feed folder at {store.feed_dir}: give the watcher's "
                             "--feed-dir (agent.json's feed_dir)")
    try:
        store.check_readable()
    except PermissionError as exc:
        raise FeedUnreadable(
            f"cannot read the feed at {store.feed_dir} ({exc.strerror or exc}): it holds every "
            "user's jobs, so only root may read it; run `malleable status` as root (or through "
            "a sudo rule your site gives), or see your own jobs with squeue") from None


def collect_status(store: FeedStore, *, only_malleable: bool = True,
                   uid: int | None = None) -> list[StatusRow]:
    """Every malleable job's rows (``uid`` None: root's view), or only those of ``uid``'s jobs."""
    rows = []
    for node in store.node_names():
        feed = store.read_node(node)
        if feed is None:
            continue
        report = store.read_report(node)
        seen = {j.job_id: j for j in report.jobs} if report is not None else {}
        for job in feed.jobs:
            if only_malleable and job.spec is None or uid is not None and job.uid != uid:
                continue
            r = seen.get(job.job_id)
            bounds = "-" if job.spec is None else \
                f"{job.spec.min_cpus}..{'node' if job.spec.max_cpus is None else job.spec.max_cpus}"
            rows.append(StatusRow(job.job_id, job.user, node, format_cpu_list(job.allocation),
                                  format_cpu_list(r.current) if r else "?", bounds, job.requested,
                                  list(r.threads) if r else [],
                                  list(r.steps_per_s) if r else []))
    return sorted(rows, key=lambda r: (r.job_id, r.node))


def collect_problems(store: FeedStore) -> list[str]:
    """What each node's agent reported it cannot verify (see ``NodeSnapshot.problems``)."""
    out = []
    for node in store.node_names():
        report = store.read_report(node)
        out += [f"node {node}: {p}" for p in (report.problems if report is not None else ())]
    return out


def format_table(rows: list[StatusRow]) -> str:
    head = (f"{'JOB':>6} {'USER':<8} {'NODE':<6} {'SLURM':<8} {'NOW':<8} {'BOUNDS':<9} "
            f"{'ASKED':>5}  THREADS/RANK  STEPS/S")
    lines = [head]
    for r in rows:
        lines.append(f"{r.job_id:>6} {r.user:<8} {r.node:<6} {r.slurm_cpus:<8} {r.current_cpus:<8} "
                     f"{r.bounds:<9} {r.requested if r.requested else '-':>5}  "
                     f"{','.join(map(str, r.threads)) or '-':<12}  "
                     f"{','.join(map(str, r.steps_per_s)) or '-'}")
    return "\n".join(lines)
