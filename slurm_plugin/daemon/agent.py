"""``malleable agent``: the per-node daemon. Foreground; a reconcile cycle every interval, at
once when the node's feed changes or on SIGUSR1 (the Epilog sends it), clean stop on
SIGTERM/SIGINT. It never asks slurmctld anything."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Callable, TypeVar

from slurm_plugin.cgroups import LayoutUnknown, SlurmCgroupLayout
from slurm_plugin.node.config import AgentConfig
from slurm_plugin.node.cgroup_actuator import WriteHook
from slurm_plugin.node.wiring import make_reconciler, node_layout
from slurm_plugin.node.ledger import LedgerCorrupt, LedgerFile
from slurm_plugin.node.reconciler import Reconciler
from slurm_plugin.node.safety import check_step_start, note, report_verdict, start_steps
from slurm_plugin.daemon.step_socket import StepStartServer, encode_answer, refusal

log = logging.getLogger(__name__)
T = TypeVar("T")


def await_layout(config: AgentConfig, *, wait_s: float,
                 discover: Callable[[AgentConfig], SlurmCgroupLayout] = node_layout,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> SlurmCgroupLayout:
    """The node's layout, waiting up to ``wait_s`` for slurmd to make its folders (an agent
    started beside slurmd); then ``LayoutUnknown``, saying what was looked for."""
    deadline = clock() + wait_s
    while True:
        try:
            return discover(config)
        except LayoutUnknown as exc:
            if clock() >= deadline:
                raise
            log.info("waiting for slurmd's cgroup folders: %s", exc)
            sleep(1.0)


def watch_feed(config: AgentConfig, store, on_change: Callable[..., None]):
    """What tells the agent its feed changed, by the feed folder's file system (notify.py):
    inotify where it is local, else a wake port registered in the feed for the watcher.
    Returns what was started (``stop()``)."""
    from slurm_plugin.feed.notify import FeedMode, InotifyWatch, WakeListener, discover_feed_mode
    mode, fstype = FeedMode(config.feed_mode), "set in the configuration"
    if mode is FeedMode.AUTO:
        mode, fstype = discover_feed_mode(config.feed_dir)
    if mode is FeedMode.LOCAL:
        for folder in (store.nodes_dir, store.offers_dir):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        watch = InotifyWatch([store.nodes_dir, store.offers_dir], on_change)
        try:
            watch.start()
            log.info("feed %s: local (%s): inotify", config.feed_dir, fstype)
            return watch
        except OSError as exc:    # out of watches (fs.inotify.max_user_watches), no inotify
            watch.stop()
            log.warning("feed %s: inotify failed (%s): taking wakes as on a shared folder",
                        config.feed_dir, exc)
    listener = WakeListener(config.node, config.wake_port, on_change)
    try:
        port = listener.start()
    except OSError as exc:
        if config.wake_port == 0:
            raise
        # Taken, by anyone on the node (a user can bind a fixed port first): the agent runs
        # on with a port of the kernel's choosing, registered as always, rather than exit and
        # be restarted into the same wall. A firewall open on the fixed port only may keep
        # the watcher's wakes out: the feed files are then looked at every feed_refresh_s.
        log.error("feed %s: wake port %d cannot be bound (%s): taking any free port",
                  config.feed_dir, config.wake_port, exc)
        listener = WakeListener(config.node, 0, on_change)
        port = listener.start()
    store.register_agent(config.node, port)
    log.info("feed %s: shared (%s): wakes on UDP port %d, files looked at every %g s",
             config.feed_dir, fstype, port, config.feed_refresh_s)
    return listener


def start_metrics(config: AgentConfig, rec, port: int, addr: str = "127.0.0.1", *,
                  retry_s: float = 5.0, per_job: bool = False):
    """Metrics of ``rec``'s cycles on ``addr:port``: serving at once if the port is free, else
    retried in the background (``MetricsServer``); never raises for a taken port, so a user
    who binds it first cannot keep the agent from reconciling. Returns the server (``stop``)."""
    from slurm_plugin.daemon.metrics import AgentMetrics, MetricsServer
    metrics = AgentMetrics(config.node, per_job=per_job)
    server = MetricsServer(metrics, port, addr, retry_s=retry_s)
    server.start()
    rec.on_cycle = metrics.observe
    return server


# Step starts of one user's jobs that one cycle fences: a burst of sruns in one job is served
# in turns of this many, every other user's step starts in each turn beside them.
MAX_STARTS_PER_USER = 16


def per_user_turn(items: list[T], owner: Callable[[T], int | None],
                  limit: int = MAX_STARTS_PER_USER) -> tuple[list[T], list[T]]:
    """``items`` split into this turn's (at most ``limit`` of each owner, in order; an unknown
    owner counts as one) and the rest, in order."""
    taken: dict[int | None, int] = {}
    now, later = [], []
    for item in items:
        who = owner(item)
        if taken.get(who, 0) < limit:
            taken[who] = taken.get(who, 0) + 1
            now.append(item)
        else:
            later.append(item)
    return now, later


def serve_step_starts(config: AgentConfig, rec: Reconciler, server: StepStartServer) -> None:
    """The step starts the SPANK plugin asked for since the last call: one fenced cycle for
    all of them (``start_steps``), each answered on the socket and noted in the hooks log like
    the Python hook's; at most ``MAX_STARTS_PER_USER`` of one user's (his jobs' owner as the
    ledger knows it), the rest in the next turns. The lock is waited for as long as a hook
    would: anyone else holding it longer is refused."""
    pending = server.take()
    if not pending:
        return                # the loop's every turn: no ledger read for nothing
    try:
        owners = LedgerFile(config.state_dir, config.node).load().allocations
    except (LedgerCorrupt, OSError):
        owners = {}           # the cycle refuses then anyway; all in one turn of unknowns
    turn, later = per_user_turn(pending, lambda p: getattr(
        owners.get(p.request.job_id), "uid", None))
    server.defer(later)
    checked = []
    for pending in turn:
        r = pending.request
        try:
            checked.append((pending, check_step_start(r.job_id, r.step, r.stepd_pid)))
        except Exception as exc:  # noqa: BLE001 - the plugin refuses the step on any failure
            note(config, f"job {r.job_id} {r.step} start failed (agent): {exc!r}")
            pending.answer(refusal(f"{type(exc).__name__}: {exc}"))
    if not checked:
        return
    try:
        verdicts = start_steps(config, rec, [(p.request.job_id, f) for p, f in checked],
                               cycle=lambda **m: rec.cycle(
                                   lock_timeout_s=config.prolog_lock_timeout_s, **m))
    except Exception as exc:  # noqa: BLE001
        for pending, _ in checked:
            r = pending.request
            note(config, f"job {r.job_id} {r.step} start failed (agent): {exc!r}")
            pending.answer(refusal(f"{type(exc).__name__}: {exc}"))
        return
    for (pending, _), verdict in zip(checked, verdicts):
        r = pending.request
        report_verdict(config, f"job {r.job_id} {r.step} start", verdict, by="agent")
        pending.answer(encode_answer(verdict))


def start_feed_link(config: AgentConfig):
    """The feed link to the watcher (feed/link_client.py) when the config names its hosts: it
    keeps the node's local feed folder in step with the watcher's. None without."""
    if not config.feed_link_hosts:
        return None
    from slurm_plugin.feed.link import link_auth
    from slurm_plugin.feed.link_client import LinkClient
    from slurm_plugin.feed.store import FeedStore
    auth = link_auth(config.feed_link_auth,
                     None if config.munge_socket is None else str(config.munge_socket))
    client = LinkClient(config.node, config.feed_link_hosts, config.feed_link_port, auth,
                        FeedStore(config.feed_dir))
    client.start()
    log.info("feed link to %s port %d (%s); the node's feed folder: %s",
             ", ".join(config.feed_link_hosts), config.feed_link_port,
             config.feed_link_auth.split(":")[0], config.feed_dir)
    return client


def run_agent(config: AgentConfig, *, once: bool = False, metrics_port: int | None = None,
              metrics_addr: str = "127.0.0.1", metrics_retry_s: float = 5.0,
              metrics_per_job: bool = False, layout_wait_s: float = 30.0,
              before_write: WriteHook | None = None) -> int:
    """Refuses to start (``LayoutUnknown``) on a node whose cgroup layout cannot be told. Logs
    through ``logging`` as set up by the caller (``malleable agent``: ``logs.setup_logging``).
    ``before_write``: a test's fault hook before each cpuset write (never the command's)."""
    layout = await_layout(config, wait_s=0.0 if once else layout_wait_s)
    log.info("cgroup layout: %s", layout.describe())
    rec = make_reconciler(config, layout, feed_refresh_s=None if once else config.feed_refresh_s,
                          before_write=before_write)
    if once:
        link = start_feed_link(config)
        if link is not None:       # the node's feed as the watcher has it now, first
            if not link.synced.wait(config.feed_link_sync_s):
                log.warning("no feed from the watcher within %g s: the cycle uses the "
                            "node's last one", config.feed_link_sync_s)
            link.stop()
        result = rec.cycle()
        for o in result.outcomes:
            a = o.action
            print(f"job {a.job_id}: {a.kind.value} {sorted(a.before)} -> {sorted(a.after)} "
                  f"({a.reason.value}) {o.status.value}")
        for failure in result.failures:
            print(f"malleable agent: {failure}", file=sys.stderr)
        return 1 if result.failures else 0
    server = None
    if metrics_port is not None:
        server = start_metrics(config, rec, metrics_port, metrics_addr, retry_s=metrics_retry_s,
                               per_job=metrics_per_job)
    config.pid_file.write_text(str(os.getpid()))
    stop = threading.Event()
    wake = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: (stop.set(), wake.set()))
    signal.signal(signal.SIGINT, lambda *_: (stop.set(), wake.set()))
    signal.signal(signal.SIGUSR1, lambda *_: wake.set())
    feed_changed = threading.Event()
    link = start_feed_link(config)
    feed_watch = watch_feed(config, rec.store, lambda *_: (feed_changed.set(), wake.set()))
    step_starts = StepStartServer(config.step_socket, wake)
    step_starts.start()
    try:
        rec.run(stop.is_set, wake, serve=lambda: serve_step_starts(config, rec, step_starts),
                feed_changed=feed_changed)
    finally:
        step_starts.stop()
        feed_watch.stop()
        if link is not None:
            link.stop()
        if server is not None:
            server.stop()
        try:
            if config.pid_file.read_text() == str(os.getpid()):
                config.pid_file.unlink()
        except OSError:
            pass
    return 0
