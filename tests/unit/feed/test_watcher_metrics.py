"""The watcher's own metrics (feed/metrics.py), fed by its real run loop on a fake clock."""
from __future__ import annotations

from prometheus_client import generate_latest

from slurm_plugin.feed import ClusterWatcher, FeedStore, WatcherConfig
from slurm_plugin.feed.metrics import WatcherMetrics
from slurm_plugin.feed.watcher import PollResult
from slurm_plugin.slurm import Node


class Client:
    def __init__(self):
        self.fail = False

    def nodes(self):
        return [Node("n1", "idle", (), 2, 0, ("debug",), address="127.0.0.1")]

    def jobs(self, layout=None, **kw):
        if self.fail:
            from malleable_protocol.runner import CommandError
            raise CommandError(["squeue"], 1, "slurm_load_jobs error")
        return []


def value(metrics: WatcherMetrics, name: str) -> float:
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def test_polls_errors_lag_and_freshness_are_counted(tmp_path):
    store = FeedStore(tmp_path)
    now = [100.0]
    client = Client()
    metrics = WatcherMetrics()

    def sleep(dt):
        now[0] += dt
        if abs(now[0] - 102.0) < 0.01:                  # slurmctld's hook writes an event
            with open(store.events_file, "a") as f:
                f.write("1 update 5\n")
        if now[0] > 110.0:
            client.fail = True

    w = ClusterWatcher(WatcherConfig(feed_dir=tmp_path, resync_s=5.0), client, store,
                       clock=lambda: now[0], wall=lambda: now[0], sleep=sleep)
    w.on_poll = metrics.observe
    w.run(lambda: now[0] > 118.0)
    assert value(metrics, 'malleable_watcher_polls_total{result="ok"}') >= 3
    assert value(metrics, 'malleable_watcher_polls_total{result="error"}') >= 1
    assert value(metrics, "malleable_watcher_node_feeds_written_total") == 1
    assert value(metrics, "malleable_watcher_event_lag_seconds_count") >= 1
    assert 100.0 <= value(metrics, "malleable_watcher_last_poll_timestamp_seconds") <= 111.0
    assert value(metrics, "malleable_watcher_jobs") == 0


def test_a_failed_poll_leaves_the_last_good_values():
    m = WatcherMetrics()
    m.observe(PollResult(nodes_written=["n1"], jobs=4, wakes_sent=1, usage_closed=[7],
                         seconds=0.02), wall=50.0, event_lag_s=0.1)
    m.observe(PollResult(error="down", seconds=20.0), wall=60.0, event_lag_s=None)
    assert value(m, "malleable_watcher_jobs") == 4
    assert value(m, "malleable_watcher_last_poll_timestamp_seconds") == 50.0
    assert value(m, "malleable_watcher_wakes_sent_total") == 1
    assert value(m, "malleable_watcher_job_usage_closed_total") == 1
