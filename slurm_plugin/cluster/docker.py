"""docker-slurm: a Slurm mini-cluster of separate nodes, one container each (``docker-slurm/``).

``render_compose`` is pure (tested against a golden file). ``prepare`` runs once inside the
image, as root, before the containers start (the Makefile's ``up`` and ``scale``): it writes the
cluster folder that every container mounts at /cluster, with the slurm.conf of the local cluster's
template naming one host per node, and the co-scheduler's hooks built against that image's Slurm.

The containers are not ``--privileged``: on a host whose bounding set lacks a capability (seen
here: CAP_SYS_RESOURCE) runc refuses privileged containers outright. They get every capability
the host has, no seccomp or AppArmor profile, and the host's cgroup v1 hierarchy bind-mounted
read-write, which is what slurmd's task/cgroup and the agent need. They share the host's cgroup
namespace, so each node's Slurm folders are kept apart by name: Debian builds Slurm with
multiple-slurmd support, which names them ``slurm_<node>``, and node names carry a prefix per
cluster.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

from malleable_policy.model import Policy
from slurm_plugin.cluster.spec import ClusterSpec, HostTopology, NAME_RE, SpecError

CLUSTER_ROOT = Path("/cluster")
# Each container runs its own munged at Debian's default socket; the key is the cluster folder's.
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
CGROUP_ROOT = "/sys/fs/cgroup"
# The Debian package's SPANK plugin (packaging/deb/build-deb.sh), built with the image.
PACKAGED_SPANK_PLUGIN = Path("/usr/lib/malleable/malleable_spank.so")


@dataclass(frozen=True)
class DockerCluster:
    project: str             # the compose project; container names start with it
    image: str
    host_dir: Path           # the host folder mounted at /cluster in every container
    nodes: int = 2
    node_prefix: str = "dn"
    # Drop this capability from the node containers (the host lacks it); None drops nothing.
    cap_drop: tuple[str, ...] = ("SYS_RESOURCE",)
    # A second controller host: a backup slurmctld and its watcher (standing by).
    backup: bool = False

    def __post_init__(self) -> None:
        if not NAME_RE.match(self.project):
            raise SpecError(f"project name {self.project!r} must match {NAME_RE.pattern}")
        if not Path(self.host_dir).is_absolute():
            raise SpecError(f"the cluster folder must be an absolute path, not {self.host_dir}")

    @property
    def controller(self) -> str:
        return f"{self.node_prefix}ctl"

    @property
    def backup_controllers(self) -> tuple[str, ...]:
        return (f"{self.node_prefix}ctl2",) if self.backup else ()

    def spec(self, topology: HostTopology) -> ClusterSpec:
        return ClusterSpec(root=CLUSTER_ROOT, name=self.project, nodes=self.nodes,
                           node_prefix=self.node_prefix, hostname=self.controller,
                           address=self.controller, topology=topology, own_hosts=True,
                           munge_socket=MUNGE_SOCKET, feed_link=True,
                           backup_controllers=self.backup_controllers)

    def container(self, host: str) -> str:
        return f"{self.project}-{host}"

    def environment(self) -> dict[str, str]:
        """What every container (and the jobs started from it) gets: where Slurm's config and
        the co-scheduler's folders are."""
        return {"SLURM_CONF": str(CLUSTER_ROOT / "etc" / "slurm.conf"),
                "MALLEABLE_RUN_DIR": str(CLUSTER_ROOT / "malleable"),
                "MALLEABLE_FEED_DIR": str(CLUSTER_ROOT / "feed")}


def render_compose(cluster: DockerCluster, node_names: list[str]) -> str:
    """The compose file (version 2.4, which docker-compose 1.29 and 2.x both read; JSON is YAML):
    the controller first, each node when the controller is healthy."""
    common = {
        "image": cluster.image,
        "init": True,                      # docker-init reaps what slurmstepd leaves behind
        "cap_add": ["ALL"],
        "cap_drop": list(cluster.cap_drop),
        "security_opt": ["seccomp:unconfined", "apparmor:unconfined"],
        "volumes": [f"{cluster.host_dir}:{CLUSTER_ROOT}", f"{CGROUP_ROOT}:{CGROUP_ROOT}:rw"],
        "environment": cluster.environment(),
        "shm_size": "256m",                # Open MPI's shared memory between a node's ranks
        "stop_grace_period": "20s",
    }

    def health(role: str) -> dict:
        return {"test": ["CMD", "/usr/local/bin/healthcheck.sh", role],
                "interval": "2s", "timeout": "10s", "retries": 90}

    controllers = (cluster.controller, *cluster.backup_controllers)
    network = None
    if cluster.backup_controllers:
        # A controller host that goes away keeps its name and address, as a real one does in
        # DNS (docker's own DNS forgets a stopped container, and Slurm 22.05's clients then fail
        # outright instead of trying the backup): fixed addresses, in every container's hosts.
        net = f"10.213.{zlib.crc32(cluster.project.encode()) % 250 + 1}"
        addresses = {host: f"{net}.{200 + i}" for i, host in enumerate(controllers)}
        common["extra_hosts"] = [f"{host}:{ip}" for host, ip in addresses.items()]
        network = {"ipam": {"config": [{"subnet": f"{net}.0/24", "ip_range": f"{net}.0/25"}]}}
    services = {}
    # A backup starts beside the primary, not after it: the primary's slurmctld, starting,
    # asks each backup to stand down and is not up until it has (or cannot resolve it).
    for host in controllers:
        services[host] = {
            **common, "hostname": host, "container_name": cluster.container(host),
            "command": ["controller"], "healthcheck": health("controller")}
        if network is not None:
            services[host]["networks"] = {"default": {"ipv4_address": addresses[host]}}
    for node in node_names:
        services[node] = {
            **common, "hostname": node, "container_name": cluster.container(node),
            "command": ["node", node], "healthcheck": health("node"),
            "depends_on": {cluster.controller: {"condition": "service_healthy"}}}
    compose: dict = {"version": "2.4", "services": services}
    if network is not None:
        compose["networks"] = {"default": network}
    return json.dumps(compose, indent=2) + "\n"


def prepare(cluster: DockerCluster, policy: Policy | None) -> ClusterSpec:
    """Inside the image, as root: the cluster folder below /cluster and its compose file."""
    from slurm_plugin.cluster.local import hooks_dir, host_topology, install_cluster_hooks, write_cluster_files
    spec = cluster.spec(host_topology())
    if policy is not None:
        # The image has the node side as docs/install.md installs it: the package's plugin.
        spec = install_cluster_hooks(spec, policy, spank_library=PACKAGED_SPANK_PLUGIN)
    else:   # an earlier `up` with a policy left hooks here: the containers would start agents
        shutil.rmtree(hooks_dir(spec), ignore_errors=True)
    write_cluster_files(spec)
    (CLUSTER_ROOT / "compose.json").write_text(render_compose(cluster, spec.node_names))
    return spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m slurm_plugin.cluster.docker")
    ap.add_argument("command", choices=["prepare"])
    ap.add_argument("--project", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--host-dir", required=True, type=Path)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--node-prefix", default="dn")
    ap.add_argument("--backup", action="store_true",
                    help="a second controller host: a backup slurmctld and its watcher")
    ap.add_argument("--policy", default=Policy.LEND_IDLE.value,
                    choices=[p.value for p in Policy] + ["none"],
                    help="the co-scheduler's policy; none runs plain Slurm")
    args = ap.parse_args(argv)
    try:
        cluster = DockerCluster(project=args.project, image=args.image, host_dir=args.host_dir,
                                nodes=args.nodes, node_prefix=args.node_prefix,
                                backup=args.backup)
        spec = prepare(cluster, None if args.policy == "none" else Policy(args.policy))
    except SpecError as exc:
        print(f"docker-slurm: {exc}", file=sys.stderr)
        return 2
    print(f"docker-slurm: {len(spec.node_names)} nodes ({', '.join(spec.node_names)}), "
          f"controller {', '.join((cluster.controller, *cluster.backup_controllers))}, "
          f"policy {args.policy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
