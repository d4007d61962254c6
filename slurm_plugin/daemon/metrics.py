"""The agent's Prometheus metrics, served on loopback unless told otherwise
(``malleable agent --metrics-address``: 0.0.0.0 or the node's address for a central Prometheus).

Any user of the node can bind a port first. The agent's port being taken never stops it:
``MetricsServer`` logs the failure, counts it and retries in the background until it binds.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)


class AgentMetrics:
    """The agent's series. Per-job series (a ``job`` label) only when ``per_job``: any local
    user can read a loopback port, and a job id list is what Slurm's PrivateData=jobs hides
    from other users; without it the node's totals are served and nothing names a job."""

    def __init__(self, node: str, *, per_job: bool = False):
        self.node = node
        self.per_job = per_job
        self.registry = CollectorRegistry()
        self.cores = Gauge("malleable_job_cores", "Cores of a job on this node",
                           ["node", "job", "kind"], registry=self.registry)
        self.resizes = Counter("malleable_resizes_total", "Cpuset changes applied",
                               ["node"], registry=self.registry)
        self.errors = Counter("malleable_cycle_errors_total", "Reconcile cycles with errors",
                              ["node"], registry=self.registry)
        self.cycle = Histogram("malleable_cycle_seconds", "Duration of a reconcile cycle",
                               ["node"], registry=self.registry,
                               buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2))
        self.jobs = Gauge("malleable_jobs", "Jobs Slurm runs on this node (every kind)",
                          ["node"], registry=self.registry)
        self.unverified = Gauge("malleable_unverified_jobs", "Jobs running here whose cgroup "
                                "folder is not where the node's layout says",
                                ["node"], registry=self.registry)
        self.faults = Gauge("malleable_job_faults", "Jobs held to their allocation this cycle "
                            "for their own input (records over budget, folders Slurm did not "
                            "make)", ["node"], registry=self.registry)
        self.bind_failures = Counter("malleable_metrics_bind_failures_total",
                                     "Failed attempts to bind the metrics port (another "
                                     "process held it)", ["node"], registry=self.registry)
        # Borrowed and lent core-seconds (``accounting``): node totals as counters, without a
        # job label (a node's series stay a handful however many jobs it runs: their rate is
        # the cores borrowed and lent on the node now), and each running job's so far as a
        # gauge that leaves with the job, like malleable_job_cores. A job's final numbers are
        # its ``job-usage`` line in the event log (the Epilog's): these miss its last interval.
        self.borrowed = Counter("malleable_borrowed_core_seconds_total", "Core-seconds jobs "
                                "held above their allocation on this node",
                                ["node"], registry=self.registry)
        self.lent = Counter("malleable_lent_core_seconds_total", "Core-seconds jobs held "
                            "below their allocation on this node (lent to others or idle)",
                            ["node"], registry=self.registry)
        self.job_borrowed = Gauge("malleable_job_borrowed_core_seconds", "Core-seconds a "
                                  "running job has held above its allocation on this node",
                                  ["node", "job"], registry=self.registry)
        self.job_lent = Gauge("malleable_job_lent_core_seconds", "Core-seconds a running job "
                              "has held below its allocation on this node",
                              ["node", "job"], registry=self.registry)
        self.borrowed.labels(node)
        self.lent.labels(node)
        self._jobs: set[str] = set()
        self._usage: dict[str, tuple[float, float]] = {}   # job -> (borrowed, lent) last seen

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Bind now or raise (``OSError``); see ``MetricsServer`` for an agent that must not."""
        start_http_server(port, addr=addr, registry=self.registry)

    def observe(self, result) -> None:
        """One reconcile cycle's result (a ``CycleResult``)."""
        self.cycle.labels(self.node).observe(result.seconds)
        self.resizes.labels(self.node).inc(len(result.applied))
        if result.failures:
            self.errors.labels(self.node).inc()
        if result.snapshot is None or result.plan is None:
            return
        self.unverified.labels(self.node).set(len(result.snapshot.problems))
        self.faults.labels(self.node).set(len(result.snapshot.faults))
        seen: set[str] = set()
        self.jobs.labels(self.node).set(len(result.snapshot.jobs))
        for job in result.snapshot.jobs if self.per_job else ():
            jid = str(job.job_id)
            seen.add(jid)
            self.cores.labels(self.node, jid, "slurm").set(len(job.allocation))
            self.cores.labels(self.node, jid, "current").set(len(result.plan.targets[job.job_id]))
        for gone in self._jobs - seen:   # ended jobs leave the exposition
            for kind in ("slurm", "current"):
                self.cores.remove(self.node, gone, kind)
        self._jobs = seen
        usage = getattr(result, "usage", None)
        if usage is not None:      # None: the cycle failed before its accounting
            self._observe_usage(usage)

    def _observe_usage(self, usage) -> None:
        """The running jobs' usage after a cycle (job id -> ``CoreUsage``). The node counters
        grow by what each job added since the last cycle; a job seen for the first time adds
        nothing (a new job has nothing yet; after an agent restart the counters start again
        from 0, and what the job had was counted by the agent before)."""
        seen: dict[str, tuple[float, float]] = {}
        for job_id, u in usage.items():
            jid = str(job_id)
            now = seen[jid] = (u.borrowed_core_s, u.lent_core_s)
            before = self._usage.get(jid)
            for i, (total, job_series) in enumerate(((self.borrowed, self.job_borrowed),
                                                  (self.lent, self.job_lent))):
                if before is not None and now[i] > before[i]:
                    total.labels(self.node).inc(now[i] - before[i])
                if self.per_job:
                    job_series.labels(self.node, jid).set(now[i])
        for gone in (set(self._usage) - set(seen)) if self.per_job else ():
            self.job_borrowed.remove(self.node, gone)
            self.job_lent.remove(self.node, gone)
        self._usage = seen


class MetricsServer:
    """Serves ``metrics`` on ``addr:port``. ``start`` tries once at once; if the port cannot be
    had (a user bound it first, a previous agent still holds it) it says so in the log, counts
    it (``bind_failures`` here, ``malleable_metrics_bind_failures_total`` once served) and
    tries again every ``retry_s`` in a daemon thread until it binds or ``stop`` is called. No
    thread is started before ``start``."""

    LOG_EVERY = 60

    def __init__(self, metrics: AgentMetrics, port: int, addr: str = "127.0.0.1", *,
                 retry_s: float = 5.0,
                 serve: Callable[..., object] = start_http_server):
        if retry_s <= 0:
            raise ValueError(f"retry_s must be positive, not {retry_s}")
        self.metrics = metrics
        self.port = port
        self.addr = addr
        self.retry_s = retry_s
        self.bind_failures = 0
        self._serve = serve
        self._server = None
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def bound(self) -> bool:
        return self._bound.is_set()

    def wait_bound(self, timeout: float | None = None) -> bool:
        return self._bound.wait(timeout)

    def try_bind(self) -> bool:
        """One attempt; True once serving."""
        if self.bound:
            return True
        try:
            served = self._serve(self.port, addr=self.addr, registry=self.metrics.registry)
        except OSError as exc:
            self.bind_failures += 1
            self.metrics.bind_failures.labels(self.metrics.node).inc()
            if self.bind_failures % self.LOG_EVERY != 1 and self.LOG_EVERY > 1:
                return False      # said on the first failure and every LOG_EVERY-th after
            log.error("cannot serve metrics on %s:%d (%s; failure %d): retrying every %g s; "
                      "the agent runs on without them", self.addr, self.port,
                      exc.strerror or exc, self.bind_failures, self.retry_s)
            return False
        # prometheus_client >= 0.20 returns (server, thread); older ones None.
        self._server = served[0] if isinstance(served, tuple) else None
        self._bound.set()
        if self.bind_failures:
            log.warning("serving metrics on %s:%d after %d failed attempt(s)", self.addr,
                        self.port, self.bind_failures)
        return True

    def start(self) -> bool:
        """Bind now if the port is free, else keep trying in the background. Never raises for
        a taken port. True when serving already."""
        if self.try_bind():
            return True
        if self._thread is None:
            self._thread = threading.Thread(target=self._retry, name="malleable-metrics-bind",
                                            daemon=True)
            self._thread.start()
        return False

    def _retry(self) -> None:
        while not self._stop.wait(self.retry_s):
            if self.try_bind():
                return

    def stop(self) -> None:
        """Stops retrying and serving (the port is free again)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
