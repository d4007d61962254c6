"""The watcher's own Prometheus metrics (``malleable watcher --metrics-port``): its polls of
slurmctld, how long they take, how far the feed lags behind slurmctld's events, the jobs it
sees, what it publishes and wakes. Served by the agent's ``MetricsServer`` (a taken port never
stops the watcher)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from slurm_plugin.feed.watcher import PollResult


class WatcherMetrics:
    def __init__(self, node: str = "watcher"):
        self.node = node                    # the label MetricsServer counts bind failures by
        self.registry = r = CollectorRegistry()
        self.polls = Counter("malleable_watcher_polls_total", "Polls of slurmctld (one "
                             "REQUEST_JOB_INFO each)", ["result"], registry=r)
        self.poll_seconds = Histogram("malleable_watcher_poll_seconds", "Duration of a poll "
                                      "(squeue, feeds written, wakes sent, usage closed)",
                                      registry=r, buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1,
                                                           2, 5, 10))
        self.event_lag = Histogram("malleable_watcher_event_lag_seconds", "From slurmctld's "
                                   "hook appending an event to the feed written after it",
                                   registry=r, buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5))
        self.jobs = Gauge("malleable_watcher_jobs", "Jobs slurmctld listed at the last poll",
                          registry=r)
        self.last_poll = Gauge("malleable_watcher_last_poll_timestamp_seconds", "Wall time of "
                               "the last successful poll", registry=r)
        self.nodes_written = Counter("malleable_watcher_node_feeds_written_total",
                                     "Node feeds written (their content had changed)",
                                     registry=r)
        self.wakes = Counter("malleable_watcher_wakes_sent_total", "Wake datagrams sent to "
                             "agents on a shared feed", registry=r)
        self.usage_closed = Counter("malleable_watcher_job_usage_closed_total", "Ended jobs "
                                    "whose borrowed and lent cores were written",
                                    registry=r)
        self.bind_failures = Counter("malleable_metrics_bind_failures_total",
                                     "Failed attempts to bind the metrics port",
                                     ["node"], registry=r)

    def observe(self, result: PollResult, *, wall: float, event_lag_s: float | None) -> None:
        self.polls.labels("error" if result.error else "ok").inc()
        self.poll_seconds.observe(result.seconds)
        if result.error:
            return
        self.jobs.set(result.jobs)
        self.last_poll.set(wall)
        self.nodes_written.inc(len(result.nodes_written))
        self.wakes.inc(result.wakes_sent)
        self.usage_closed.inc(len(result.usage_closed))
        if event_lag_s is not None:
            self.event_lag.observe(max(0.0, event_lag_s))
