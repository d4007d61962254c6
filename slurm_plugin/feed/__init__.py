"""The cluster-level view of malleable jobs, and how it reaches the node agents.

One ``ClusterWatcher`` per cluster (on the slurmctld host) asks slurmctld for the jobs once per
event or resync, whatever the number of nodes, and publishes one ``NodeFeed`` per node into a
``FeedStore`` folder the node agents read. Events are written by slurmctld's own hooks
(job_submit.lua's modify hook, PrologSlurmctld, EpilogSlurmctld) into the store's event file.
Node agents also publish their per-job offers there, so a multi-node job is sized as one job.
"""
from slurm_plugin.feed.model import FeedJob, JobReport, NodeFeed, NodeReport, Offers
from slurm_plugin.feed.store import FeedStore
from slurm_plugin.feed.watcher import ClusterWatcher, WatcherConfig

__all__ = ["FeedJob", "JobReport", "NodeFeed", "NodeReport", "Offers", "FeedStore", "ClusterWatcher", "WatcherConfig"]
