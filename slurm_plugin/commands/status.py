"""``malleable status``: per malleable job and node, Slurm's cores, the current cores, the
bounds, each rank's active threads and steps/s. It reads only the feed folder (the watcher's
view of Slurm and each node agent's report): it works wherever that folder is mounted, and
costs slurmctld nothing.

Slurm's PrivateData=jobs: a user sees only his own jobs. The feed holds every user's, so it is
root's alone (``feed.store``): ``malleable status`` run by anyone else cannot read it and says so
(``FeedUnreadable``); where a site lets others read it anyway, a user other than root is shown
only the rows of his own jobs (``uid``) and no node's problems.

Each job's core-seconds borrowed above its allocation and lent below it so far, per node, come
from the node's ledger (``accounting``), in root's state folder (``state_dir``, by default the
feed folder's sibling ``agent``: /run/malleable/agent). Where that folder is not the node's
(a login node; a compute node shows its own jobs), or for anyone but root, they are unknown
(``-``, null in ``--json``)."""
from __future__ import annotations

import argparse
import json
import os
import pwd
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from malleable_protocol import RankStatus, RunLayout, Target, format_cpu_list
from malleable_protocol.layout import DEFAULT_RUN_DIR
from malleable_protocol.records import MAX_RANK_RECORDS, MAX_RECORD_BYTES, ProtocolError
from malleable_protocol.runner import CommandError, CommandRunner, run_command
from malleable_protocol.safe_io import read_bounded

from slurm_plugin.commands.common import (DEFAULT_AGENT_CONFIG, CliError, job_id_arg,
                                          job_ids_arg, users_arg)
from slurm_plugin.feed.store import FeedStore
from slurm_plugin.node.accounting import so_far
from slurm_plugin.node.core_usage import CoreUsage
from slurm_plugin.node.ledger import LedgerFile
from slurm_plugin.node.config import AgentConfig, AgentConfigError, load_agent_config
from slurm_plugin.settings import DEFAULT_FEED_DIR, RootSettings, root_settings


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
    borrowed_core_s: float | None = None     # so far on this node; None: unknown here
    lent_core_s: float | None = None
    uid: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class FeedUnreadable(Exception):
    """There is no feed to show: this user may not read it (anyone but root), or (the
    subclasses) it is not there."""


class FeedMissing(FeedUnreadable):
    """No feed folder where it was looked for (a wrong ``--feed-dir``)."""


class FeedEmpty(FeedUnreadable):
    """The feed folder is there, but no node was published into it (no watcher ran yet)."""


def check_feed(store: FeedStore) -> None:
    """Raises ``FeedMissing`` when there is no feed folder at all (a wrong ``--feed-dir``
    showed an empty table and exit 0), ``FeedUnreadable`` when this process may not read it,
    ``FeedEmpty`` when no node's feed was published there yet."""
    if not store.feed_dir.is_dir():
        raise FeedMissing(f"no feed folder at {store.feed_dir}: give the watcher's "
                          "--feed-dir (agent.json's feed_dir; or set MALLEABLE_FEED_DIR)")
    try:
        store.check_readable()
    except PermissionError as exc:
        raise FeedUnreadable(
            f"cannot read the feed at {store.feed_dir} ({exc.strerror or exc}): it holds every "
            "user's jobs, so only root may read it; run `malleable status` as root (or through "
            "a sudo rule your site gives), or see your own jobs with squeue") from None
    if not store.node_names():
        raise FeedEmpty(f"the feed folder {store.feed_dir} holds no node's feed yet: is "
                        f"`malleable watcher --feed-dir {store.feed_dir}` running (on the "
                        "slurmctld host)? `malleable watcher --once` publishes once")


def own_rows_here(layout: RunLayout, node: str, job_ids: list[int], user: str,
                  uid: int) -> list[StatusRow]:
    """A user's own jobs on this node, from what the node lets him read without the feed: each
    job's target (root's, readable by the job's user alone: its cores now) and the records his
    ranks write in his job's folder (threads, steps/s). Slurm's allocation and the bounds are
    the feed's ("-")."""
    rows = []
    for job_id in job_ids:
        try:
            cpus = format_cpu_list(Target.decode(read_bounded(
                layout.target_file(job_id, node), MAX_RECORD_BYTES)).cpus)
        except (OSError, ProtocolError):
            cpus = "?"                 # not malleable, not started here yet, or not his
        threads, rates = [], []
        try:
            names = sorted(n for n in os.listdir(layout.job_dir(job_id))
                           if RunLayout.parse_status_name(n) is not None)[:MAX_RANK_RECORDS]
        except OSError:
            names = []
        for name in names:
            try:
                rec = RankStatus.decode(read_bounded(layout.job_dir(job_id) / name,
                                                     MAX_RECORD_BYTES))
            except (OSError, ProtocolError):
                continue
            threads.append(rec.intra_active)
            rates.append(round(rec.steps_per_s.get(rec.intra_active, 0.0), 2))
        if cpus != "?" or threads:
            rows.append(StatusRow(job_id, user, node, "-", cpus, "-", None, threads, rates,
                                  uid=uid))
    return rows


def own_jobs_on(node: str, runner: CommandRunner) -> list[int]:
    """The running jobs of this process's user on ``node``, as Slurm shows them to him
    (squeue --me: his own, whatever PrivateData says); %A: each array element's own id."""
    out = runner(["squeue", "--me", "--noheader", "--states=RUNNING", f"--nodelist={node}",
                  "--format=%A"], timeout=30).stdout
    return sorted({int(w) for w in out.split() if w.isdigit() and w.isascii() and len(w) < 12})


def installed_config(agent_json: Path) -> AgentConfig | None:
    """The install's agent.json on this host (readable by every user), None without one."""
    try:
        return load_agent_config(agent_json)
    except AgentConfigError:
        return None


def feed_dir_here(config: AgentConfig | None) -> Path:
    """The feed this host holds, by the install's agent.json: on a watcher's host (the
    controller) the watcher's folder, every node's feed; on a node, its own feed. Without a
    readable agent.json, the default."""
    if config is None:
        return DEFAULT_FEED_DIR
    if config.watcher_dir is not None and config.watcher_dir.is_dir():   # the watcher makes it
        return config.watcher_dir
    return config.feed_dir


def node_usage(state_dir: Path | None, node: str, now: float) -> dict[int, CoreUsage]:
    """The node's running jobs' usage, integrated up to ``now``, from its ledger in
    ``state_dir``; empty when there is none there or it cannot be read (not root)."""
    if state_dir is None:
        return {}
    try:
        ledger = LedgerFile(state_dir, node).load()
    except (OSError, ValueError):  # not root, a bad node name, a ledger kept aside as corrupt
        return {}
    return {job_id: so_far(u, now) for job_id, u in ledger.usage.items()}


def collect_status(store: FeedStore, *, only_malleable: bool = True,
                   uid: int | None = None, state_dir: Path | None = None,
                   now: float | None = None) -> list[StatusRow]:
    """Every malleable job's rows (``uid`` None: root's view), or only those of ``uid``'s jobs.
    ``state_dir``: where the nodes' ledgers are (root's view only), for the core-seconds each
    job borrowed and lent up to ``now`` (default: the clock's now)."""
    rows = []
    now = time.time() if now is None else now
    for node in store.node_names():
        feed = store.read_node(node)
        if feed is None:
            continue
        usage = node_usage(state_dir, node, now) if uid is None else {}
        report = store.read_report(node)
        seen = {j.job_id: j for j in report.jobs} if report is not None else {}
        for job in feed.jobs:
            if only_malleable and job.spec is None or uid is not None and job.uid != uid:
                continue
            r = seen.get(job.job_id)
            bounds = "-" if job.spec is None else \
                f"{job.spec.min_cpus}..{'node' if job.spec.max_cpus is None else job.spec.max_cpus}"
            u = usage.get(job.job_id)
            rows.append(StatusRow(job.job_id, job.user, node, format_cpu_list(job.allocation),
                                  format_cpu_list(r.current) if r else "?", bounds, job.requested,
                                  list(r.threads) if r else [],
                                  list(r.steps_per_s) if r else [],
                                  round(u.borrowed_core_s, 1) if u else None,
                                  round(u.lent_core_s, 1) if u else None, job.uid))
    return sorted(rows, key=lambda r: (r.job_id, r.node))


def collect_problems(store: FeedStore) -> list[str]:
    """What each node's agent reported it cannot verify (see ``NodeSnapshot.problems``)."""
    out = []
    for node in store.node_names():
        report = store.read_report(node)
        out += [f"node {node}: {p}" for p in (report.problems if report is not None else ())]
    return out


def _core_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def format_table(rows: list[StatusRow]) -> str:
    """BORROWED and LENT: core-seconds so far on the node (``-``: unknown here)."""
    head = (f"{'JOB':>6} {'USER':<8} {'NODE':<6} {'SLURM':<8} {'NOW':<8} {'BOUNDS':<9} "
            f"{'ASKED':>5} {'BORROWED':>9} {'LENT':>9}  THREADS/RANK  STEPS/S")
    lines = [head]
    for r in rows:
        lines.append(f"{r.job_id:>6} {r.user:<8} {r.node:<6} {r.slurm_cpus:<8} {r.current_cpus:<8} "
                     f"{r.bounds:<9} {r.requested if r.requested else '-':>5} "
                     f"{_core_s(r.borrowed_core_s):>9} {_core_s(r.lent_core_s):>9}  "
                     f"{','.join(map(str, r.threads)) or '-':<12}  "
                     f"{','.join(map(str, r.steps_per_s)) or '-'}")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    st = sub.add_parser("status", help="malleable jobs: cores and threads per node (root: "
                        "every user's; the feed is root's, like PrivateData=jobs)")
    st.add_argument("job_id", nargs="?", type=job_id_arg,
                    help="only this job (rigid or malleable); exit 1 if it is not in the feed")
    st.add_argument("--feed-dir", default=env.feed_dir and str(env.feed_dir),
                    help="the feed to read (default: $MALLEABLE_FEED_DIR; else, from --config, "
                         "the watcher's folder on its host, the node's own feed elsewhere; "
                         f"else {DEFAULT_FEED_DIR})")
    st.add_argument("--config", default=DEFAULT_AGENT_CONFIG,
                    help="agent.json, for the feed's folders (default %(default)s)")
    st.add_argument("--state-dir", default=env.state_dir and str(env.state_dir),
                    help="the node agents' state folder, for the core-seconds each job borrowed "
                    "and lent (default: the feed folder's sibling 'agent'; only this node's "
                    "ledger is there on a real cluster)")
    st.add_argument("-j", "--jobs", type=job_ids_arg, metavar="JOB[,JOB...]",
                    help="only these jobs (rigid or malleable), as squeue -j")
    st.add_argument("-u", "--user", type=users_arg, metavar="USER[,USER...]",
                    help="only these users' jobs (names or uids), as squeue -u")
    st.add_argument("--me", action="store_true", help="only my jobs, as squeue --me")
    st.add_argument("--node", help="without the feed (a user): the node whose jobs to show "
                    "(default: this one, SLURMD_NODENAME or the host name)")
    st.add_argument("--all", action="store_true", help="rigid jobs too")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=run)


def _own_view_here(args: argparse.Namespace, uid: int, config: AgentConfig | None,
                   jobs: set[int], why: str, runner: CommandRunner) -> int:
    """A user who may not read the feed: his own jobs on this node (``own_rows_here``), only
    ``jobs`` where given."""
    node = getattr(args, "node", None) or root_settings().node or \
        socket.gethostname().split(".")[0]
    try:
        mine = own_jobs_on(node, runner)
    except CommandError as exc:
        raise CliError(f"{why}; and your own jobs on this node could not be listed (squeue: "
                       f"{exc})") from None
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    layout = RunLayout(config.run_dir if config is not None else DEFAULT_RUN_DIR)
    rows = [r for r in own_rows_here(layout, node, mine, user, uid)
            if not jobs or r.job_id in jobs]
    print(f"your jobs on {node} only (the cluster's feed is root's); every node of job J: "
          "srun --jobid J --overlap --ntasks-per-node=1 malleable status", file=sys.stderr)
    print(json.dumps([r.to_dict() for r in rows], indent=2) if args.json
          else format_table(rows))
    return 0


def run(args: argparse.Namespace, *, uid: int | None = None,
        runner: CommandRunner = run_command) -> int:
    """Root sees every job and each node's problems; anyone else (PrivateData=jobs) only his
    own jobs, and only where the feed is readable to him. Exit 1 with what to do when there is
    no status to show: no feed folder, a feed no node was published into yet, a feed this user
    may not read, a job (``job_id``) not in it; also when a node reports a problem."""
    uid = os.geteuid() if uid is None else uid
    config = installed_config(Path(getattr(args, "config", None) or DEFAULT_AGENT_CONFIG))
    store = FeedStore(Path(args.feed_dir) if args.feed_dir else feed_dir_here(config))
    job_id = getattr(args, "job_id", None)
    jobs = set(getattr(args, "jobs", None) or ()) | ({job_id} if job_id is not None else set())
    try:
        check_feed(store)
    except FeedUnreadable as exc:
        if uid == 0:
            raise CliError(str(exc)) from None
        return _own_view_here(args, uid, config, jobs, str(exc), runner)
    users = set(getattr(args, "user", None) or ()) | ({uid} if getattr(args, "me", False)
                                                       else set())
    state_dir = Path(getattr(args, "state_dir", None) or store.feed_dir.parent / "agent")
    rows = collect_status(store, only_malleable=not args.all and not jobs,
                          uid=None if uid == 0 else uid, state_dir=state_dir)
    problems = collect_problems(store) if uid == 0 else []
    if users:
        rows = [r for r in rows if r.uid in users]
    if jobs:
        rows = [r for r in rows if r.job_id in jobs]
        missing = sorted(jobs - {r.job_id for r in rows})
        if missing and not users:
            raise CliError(f"no job {','.join(map(str, missing))} in the feed at "
                           f"{store.feed_dir}: not running (or not started yet), not seen by the "
                           "watcher yet" + ("" if uid == 0 else ", or not yours")
                           + "; squeue shows the jobs")
        nodes = {r.node for r in rows}
        problems = [p for p in problems if p.split(":", 1)[0][len("node "):] in nodes]
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        print(format_table(rows))
    for line in problems:     # also with --json: on stderr, and the exit code says so
        print(f"PROBLEM {line}", file=sys.stderr if args.json else sys.stdout)
    return 1 if problems else 0
