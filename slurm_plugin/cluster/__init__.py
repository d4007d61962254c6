"""The local Slurm mini-cluster (and the spec shared with docker-slurm/)."""
from slurm_plugin.cluster.local import DEFAULT_ROOT, ClusterError, ClusterStatus, LocalCluster, default_spec
from slurm_plugin.cluster.spec import ClusterSpec, HostTopology, SpecError, render_cgroup_conf, render_slurm_conf

__all__ = ["DEFAULT_ROOT", "ClusterError", "ClusterStatus", "LocalCluster", "default_spec",
           "ClusterSpec", "HostTopology", "SpecError", "render_cgroup_conf", "render_slurm_conf"]
