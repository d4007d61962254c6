"""``malleable watcher``: the one process per cluster that asks slurmctld about jobs.

It polls when slurmctld's hooks append an event (a malleable ``scontrol update``, a job start or
end) and otherwise every ``resync_s``: one REQUEST_JOB_INFO per poll, plus the nodes' layout
(sinfo) every ``layout_refresh_s``. Its load on slurmctld does not depend on the node count.

After a poll it closes the usage of the jobs that ended (``usage.py``): for those that borrowed
or lent cores, two sacct calls and one sacctmgr to slurmdbd per poll, whatever their number.
"""
from __future__ import annotations

import json
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from malleable_protocol.runner import CommandError
from slurm_plugin.slurm import JobAccounting, Node, SlurmClient, SlurmClientError
from slurm_plugin.slurm.parsers import SlurmParseError
from malleable_policy.request import spec_and_request
from slurm_plugin.feed.model import FeedJob, NodeFeed, partition_name
from slurm_plugin.topology import SlurmLayout
from slurm_plugin.feed.notify import send_wake
from slurm_plugin.feed.store import FeedStamp, FeedStore
from slurm_plugin.feed.usage import JobUsage, NodeUsage, UsageError, jobs_to_close, system_comment
from slurm_plugin.feed.usage_runner import InlineUsage, UsageRunner

from slurm_plugin.feed.leader import Role

if TYPE_CHECKING:
    from slurm_plugin.feed.link_server import LinkServer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatcherConfig:
    feed_dir: Path
    slurm_conf: Path | None = None
    resync_s: float = 10.0           # a full poll when no event came
    layout_refresh_s: float = 300.0  # the nodes' layout (sinfo) is re-read this often
    event_check_s: float = 0.05      # how often the (local) event file is looked at
    event_settle_s: float = 0.02     # a burst of events is one poll
    event_min_gap_s: float = 0.25    # events make it poll at most this often (a user's loop
                                     # of updates costs slurmctld at most 4 polls a second)
    events_max_bytes: int = 1 << 20  # the event file is rotated past this
    usage_jobs_per_poll: int = 64    # ended jobs whose usage one poll closes (3 dbd calls for
                                     # all of them)
    usage_retry_s: float = 86400.0   # a job's usage the database refuses this long is logged
                                     # to usage.jsonl without it
    role_check_s: float = 2.0        # with backup controllers: how often leader.py is asked
    takeover_wait_s: float = 3.0     # a watcher taking over waits this long after it first saw
                                     # itself active, so the one it replaces (which checks every
                                     # role_check_s) has stood down: never two writers


@dataclass
class RunState:
    """What ``ClusterWatcher.run`` carries from one pass to the next."""
    last_events: FeedStamp | None = None   # the event file's stamp at the last poll
    backoff: float = 10.0              # seconds between polls without events (grows on failure)
    last_poll: float = float("-inf")
    last_role: float = float("-inf")


@dataclass
class PollResult:
    nodes_written: list[str] = field(default_factory=list)
    jobs: int = 0
    usage_closed: list[int] = field(default_factory=list)
    wakes_sent: int = 0
    error: str | None = None
    seconds: float = 0.0


def build_feeds(jobs, layout: Sequence[Node], updated: float,
                switched_off: str | None = None) -> dict[str, NodeFeed]:
    """One NodeFeed per node of ``layout``: the jobs holding cores there, and the site's kill
    switch when thrown. Pure."""
    per_node: dict[str, list[FeedJob]] = {n.name: [] for n in layout}
    for job in jobs:
        if not job.state.holds_cores:
            continue
        spec, requested = spec_and_request(job.admin_comment, job.comment)
        for node, cpus in job.cpu_ids.items():
            if node in per_node and cpus:
                per_node[node].append(FeedJob(job_id=job.job_id, uid=job.uid, user=job.user,
                                              allocation=cpus, nodes=tuple(job.nodes),
                                              spec=spec, requested=requested,
                                              partition=partition_name(job.partition)))
    return {n.name: NodeFeed(node=n.name, cpus=n.cpus,
                             jobs=tuple(sorted(per_node[n.name], key=lambda j: j.job_id)),
                             updated=updated,
                             layout=SlurmLayout(n.sockets, n.cores_per_socket,
                                                n.threads_per_core),
                             switched_off=switched_off)
            for n in layout}


class ClusterWatcher:
    def __init__(self, config: WatcherConfig, client: SlurmClient, store: FeedStore, *,
                 accounting: JobAccounting | None = None,
                 send_wake: Callable[[str, int, str], None] = send_wake,
                 link: "LinkServer | None" = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep,
                 usage: UsageRunner | None = None):
        self.config = config
        # Where ended jobs' usage is closed (usage_runner.py): the watcher's command closes it
        # in a thread of its own; by default at once, in the poll.
        self.usage: UsageRunner = usage if usage is not None else InlineUsage()
        self.client = client
        self.store = store
        self.accounting = accounting    # None: no slurmdbd, usage goes to usage.jsonl only
        self._send_wake = send_wake
        self.link = link                # the feed link's server: nodes with local folders
        # With backup controllers (leader.py): this host's role now and why; None: always
        # active. ``on_role`` is told each change (the feed link listens only while active).
        self.role_of: Callable[[], tuple[Role, str]] | None = None
        self.on_role: Callable[[Role], None] | None = None
        self.role = Role.ACTIVE
        self._active_seen: float | None = None   # when a standby watcher first saw it is active
        # Called after every poll of run() with the result, the wall time and the lag behind
        # the event that caused it (None for a resync): the metrics' (feed/metrics.py).
        self.on_poll: Callable[..., None] | None = None
        self._clock, self._wall, self._sleep = clock, wall, sleep
        self._layout: list[Node] = []
        self._layout_at = float("-inf")
        self._published: dict[str, NodeFeed] = {}

    def _nodes(self, force: bool = False) -> list[Node]:
        if force or not self._layout or \
                self._clock() - self._layout_at >= self.config.layout_refresh_s:
            self._layout = self.client.nodes()
            self._layout_at = self._clock()
        return self._layout

    def poll(self) -> PollResult:
        t0 = self._clock()
        began = self._wall()        # every job Slurm allocated before this is in the poll
        result = PollResult()
        try:
            layout = self._nodes()
            jobs = self.client.jobs(layout=layout)
            known = {n.name for n in layout}
            if any(node not in known for j in jobs for node in j.cpu_ids):
                layout = self._nodes(force=True)   # a node added to the cluster
                jobs = self.client.jobs(layout=layout)
        except (CommandError, SlurmParseError, ValueError) as exc:
            result.error = str(exc)
            result.seconds = self._clock() - t0
            return result
        result.jobs = len(jobs)
        if self.role_of is not None and self.role_of()[0] is not Role.ACTIVE:
            # Slurm's control moved while the commands ran (they may take many seconds): another
            # watcher may be active already, so this one writes nothing.
            result.error = "no longer the active watcher"
            result.seconds = self._clock() - t0
            return result
        switched_off = self.store.site_switched_off()
        for name, feed in build_feeds(jobs, layout, self._wall(), switched_off).items():
            if not feed.same_content(self._published.get(name)):
                self.store.write_node(feed)
                self._published[name] = feed
                result.nodes_written.append(name)
        result.wakes_sent = self._wake_agents(layout, result.nodes_written)
        if self.link is not None:
            self.link.publish(self._published)
        try:
            self.store.write_polled(began)
        except OSError as exc:
            log.warning("poll time not published: %s", exc)
        if self.link is not None:
            self.link.polled(began)
        # The usage of ended jobs, beside the polls (usage_runner.py): a slow slurmdbd never
        # holds the next feed back.
        self.usage.hand(lambda: self._close_usage_logged(jobs))
        result.usage_closed = self.usage.closed()
        result.seconds = self._clock() - t0
        return result

    def _close_usage_logged(self, jobs) -> list[int]:
        try:
            return self.close_usage(jobs)
        except OSError as exc:
            log.warning("job usage not closed: %s", exc)
            return []

    def _wake_agents(self, layout: Sequence[Node], written: Sequence[str]) -> int:
        """A wake datagram to each node whose feed was written and whose agent registered a
        wake port (a shared feed folder: notify.py), at the node's NodeAddr. Returns how many
        were sent."""
        addresses = {n.name: n.address or n.hostname or n.name for n in layout}
        sent = 0
        for name in written:
            port = self.store.agent_wake_port(name)
            if port is not None:
                self._send_wake(addresses.get(name, name), port, name)
                sent += 1
        return sent

    def close_usage(self, jobs) -> list[int]:
        """The usage of the jobs that ended (``jobs_to_close``), at most
        ``usage_jobs_per_poll`` of them: written into the database (when there is one), logged to
        usage.jsonl, the nodes' files removed. A job the database refuses stays for the next
        poll, until ``usage_retry_s`` after its end. Returns the job ids closed."""
        files = self.store.usage_files()
        usages = {job_id: self._job_usage(job_id, files[job_id])
                  for job_id in jobs_to_close(files, jobs)[:self.config.usage_jobs_per_poll]}
        # A job that neither borrowed nor lent (every rigid one) has nothing for the database:
        # only its line in the log.
        sacct = self._write_sacct([u for u in usages.values() if u is not None and
                                   (u.borrowed_core_s or u.lent_core_s)])
        if self.role_of is not None and self.role_of()[0] is not Role.ACTIVE:
            # Control moved while the database calls ran (they may take a minute): the watcher
            # now active closes these jobs (its database write is the same text again); a line
            # from this one too would log them twice.
            log.warning("stood down while closing %d jobs' usage: left to the active watcher",
                        len(usages))
            return []
        closed = []
        for job_id, usage in usages.items():
            if usage is not None:
                written = sacct.get(job_id, False)
                if written is None and self._wall() - max(u.end for u in usage.nodes) < \
                        self.config.usage_retry_s:
                    continue            # the database may take it at the next poll
                self.store.log_usage(json.dumps(usage.to_json(sacct=bool(written)),
                                                sort_keys=True))
            for name in files[job_id]:
                self.store.remove_usage(name)
            closed.append(job_id)
        return closed

    def _job_usage(self, job_id: int, names: Sequence[str]) -> JobUsage | None:
        """The job's usage summed over its nodes' files; a file that cannot be read is dropped
        (logged), None when nothing is left."""
        nodes = []
        for name in names:
            try:
                nodes.append(NodeUsage.decode(self.store.read_usage(name)))
            except (OSError, UsageError) as exc:
                log.warning("job %d: usage file %s dropped: %s", job_id, name, exc)
        try:
            return JobUsage.of(job_id, nodes)
        except UsageError as exc:
            log.warning("%s", exc)
            return None

    def _write_sacct(self, usages: Sequence[JobUsage]) -> dict[int, bool | None]:
        """Each job's usage into its SystemComment: three calls to slurmdbd whatever the number
        of jobs (read, write, read back). Per job, True: written; False: no database, or the
        comment there cannot be kept; None: the database failed (or has no record of the job
        yet): try again."""
        if self.accounting is None or not usages:
            return {u.job_id: False for u in usages}
        result: dict[int, bool | None] = {u.job_id: None for u in usages}
        try:
            old = self.accounting.system_comments(list(result))
        except (CommandError, SlurmClientError, ValueError) as exc:
            log.warning("usage of %d jobs not written to the database: %s", len(usages), exc)
            return result
        texts = {}
        for usage in usages:
            if usage.job_id not in old:
                log.info("job %d: not in the accounting database yet", usage.job_id)
                continue
            try:
                texts[usage.job_id] = system_comment(old[usage.job_id], usage)
            except UsageError as exc:
                log.warning("%s: its usage goes to usage.jsonl only", exc)
                result[usage.job_id] = False
        if not texts:
            return result
        try:
            self.accounting.set_system_comments(texts)
        except (CommandError, SlurmClientError, ValueError) as exc:
            # sacctmgr goes on past a job it cannot modify: what it wrote is read back.
            log.warning("sacctmgr: %s", exc)
        try:
            now = self.accounting.system_comments(list(texts))
        except (CommandError, SlurmClientError, ValueError) as exc:
            log.warning("usage of %d jobs not read back from the database: %s", len(texts), exc)
            return result
        for job_id, text in texts.items():
            if now.get(job_id) == text:
                result[job_id] = True
                log.info("job %d: %s", job_id, text)
            else:
                log.warning("job %d: usage not written to the database (it reads %r)", job_id,
                            now.get(job_id))
        return result

    def _rotate_events(self) -> None:
        path = self.store.events_file
        try:
            st = path.stat()
            if st.st_size > self.config.events_max_bytes:
                os.replace(path, path.with_name("events.1"))
                # The new one as the old: its owner (SlurmUser appends to it), nothing for others.
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                             os.O_CLOEXEC, 0o600)
                try:
                    os.fchown(fd, st.st_uid, st.st_gid)
                    os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o770)
                finally:
                    os.close(fd)
        except OSError:
            pass

    def _check_role(self) -> None:
        """Asks ``role_of`` (if set) and updates ``role``. A standby watcher becomes active
        only once it has seen itself active for ``takeover_wait_s``."""
        if self.role_of is None:
            return
        role, why = self.role_of()
        if role is Role.ACTIVE and self.role is Role.STANDBY:
            if self._active_seen is None:
                self._active_seen = self._clock()
                log.warning("taking over in %g s: %s", self.config.takeover_wait_s, why)
            if self._clock() - self._active_seen < self.config.takeover_wait_s:
                return
        self._active_seen = None
        if role is not self.role:
            log.warning("this watcher is now %s: %s", role.value, why)
            self.role = role
            if self.on_role is not None:
                self.on_role(role)

    def run(self, stop: Callable[[], bool]) -> None:
        """Polls until ``stop``: one ``step`` every ``event_check_s``."""
        self.store.prepare()
        loop = RunState(last_events=self.store.events_stamp(), backoff=self.config.resync_s)
        while not stop():
            self.step(loop)
            self._sleep(self.config.event_check_s)

    def step(self, loop: "RunState") -> None:
        """One pass of ``run``: the role checked when due, then a poll when an event came (at
        most every ``event_min_gap_s``) or ``resync_s`` (``backoff`` after a failure) passed."""
        if self._clock() - loop.last_role >= self.config.role_check_s or \
                self._active_seen is not None:
            loop.last_role, was = self._clock(), self.role
            self._check_role()
            if self.role is Role.ACTIVE and was is not Role.ACTIVE:
                loop.last_poll = float("-inf")        # a watcher taking over polls at once
        if self.role is not Role.ACTIVE:
            return
        events = self.store.events_stamp()
        since = self._clock() - loop.last_poll
        if not ((events != loop.last_events and since >= self.config.event_min_gap_s) or
                since >= loop.backoff):
            return
        if events != loop.last_events:
            self._sleep(self.config.event_settle_s)
        evented = events != loop.last_events
        loop.last_events = self.store.events_stamp()
        result = self.poll()
        loop.last_poll = self._clock()
        if self.on_poll is not None:
            wall = self._wall()
            stamp = loop.last_events
            lag = wall - stamp.mtime_ns / 1e9 if evented and stamp else None
            self.on_poll(result, wall=wall, event_lag_s=lag)
        if result.error:
            log.warning("poll failed: %s", result.error)
            loop.backoff = min(loop.backoff * 2, 60.0)
        else:
            loop.backoff = self.config.resync_s
            if result.nodes_written:
                log.info("published %d node(s) (%d jobs) in %.0f ms",
                         len(result.nodes_written), result.jobs, result.seconds * 1000)
        self._rotate_events()
