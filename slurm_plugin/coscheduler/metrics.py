"""The agent's Prometheus metrics, served on loopback only."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server



class AgentMetrics:
    def __init__(self, node: str):
        self.node = node
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
        self.unverified = Gauge("malleable_unverified_jobs", "Jobs running here whose cgroup "
                                "folder is not where the node's layout says",
                                ["node"], registry=self.registry)
        self._jobs: set[str] = set()

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
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
        seen = set()
        for job in result.snapshot.jobs:
            jid = str(job.job_id)
            seen.add(jid)
            self.cores.labels(self.node, jid, "slurm").set(len(job.allocation))
            self.cores.labels(self.node, jid, "current").set(len(result.plan.targets[job.job_id]))
        for gone in self._jobs - seen:   # ended jobs leave the exposition
            for kind in ("slurm", "current"):
                self.cores.remove(self.node, gone, kind)
        self._jobs = seen
