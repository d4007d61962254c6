"""The docker-slurm cluster the Makefile's ``test`` brought up (it passes where, in the
environment). These tests drive it from this host, through ``docker exec`` and the cluster folder
that every container mounts at /cluster."""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_plugin.cluster.docker import CLUSTER_ROOT, DockerCluster


@dataclass(frozen=True)
class DockerSlurm:
    cluster: DockerCluster     # its names, as slurm_plugin.cluster.docker gave them
    suite: str

    @property
    def host_dir(self) -> Path:     # the host side of /cluster
        return Path(self.cluster.host_dir)

    @property
    def image(self) -> str:
        return self.cluster.image

    @property
    def controller(self) -> str:
        return self.cluster.controller

    @property
    def node_names(self) -> list[str]:
        return [f"{self.cluster.node_prefix}{i}" for i in range(1, self.cluster.nodes + 1)]

    def exec(self, host: str, argv: list[str], *, check: bool = True,
             timeout: float = 60) -> subprocess.CompletedProcess:
        """``argv`` in ``host``'s container, with the cluster's environment."""
        out = subprocess.run(["docker", "exec", self.cluster.container(host), *argv],
                             capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} on {host} exited {out.returncode}: "
                                 f"{out.stderr.strip()[-2000:]}")
        return out

    def ctl(self, *argv: str, **kw) -> subprocess.CompletedProcess:
        return self.exec(self.controller, list(argv), **kw)

    def cgroup_layout(self, node: str):
        """Where ``node``'s slurmd puts job folders, discovered from this host: on cgroup v1
        the containers share the host's hierarchies (slurm.conf and cgroup.conf are in the
        cluster folder)."""
        from slurm_plugin.cgroups import discover_layout
        return discover_layout(node, slurm_conf=self.host_dir / "etc" / "slurm.conf")

    def to_container(self, path: Path) -> str:
        """A path below the host's cluster folder, as the containers see it."""
        return str(CLUSTER_ROOT / Path(path).relative_to(self.host_dir))


@pytest.fixture(scope="session")
def docker_slurm() -> DockerSlurm:
    missing = [k for k in ("DOCKER_SLURM_PROJECT", "DOCKER_SLURM_DIR") if k not in os.environ]
    if missing:
        pytest.fail(f"run these tests with `make -C docker-slurm test` ({', '.join(missing)} unset)")
    suite = os.environ.get("DOCKER_SLURM_SUITE", "bookworm")
    return DockerSlurm(DockerCluster(project=os.environ["DOCKER_SLURM_PROJECT"],
                                     image=f"malleable-slurm:{suite}",
                                     host_dir=Path(os.environ["DOCKER_SLURM_DIR"]),
                                     nodes=int(os.environ.get("DOCKER_SLURM_NODES", "2")),
                                     node_prefix=os.environ.get("DOCKER_SLURM_PREFIX", "bw"),
                                     backup=os.environ.get("DOCKER_SLURM_BACKUP", "1") == "1"),
                       suite=suite)


@pytest.fixture
def jobs_dir(docker_slurm: DockerSlurm, request) -> Path:
    """A folder for one test's job scripts and outputs, in the shared cluster folder."""
    d = docker_slurm.host_dir / "jobs" / request.node.name
    shutil.rmtree(d, ignore_errors=True)    # a stop file of an earlier run would end its job
    d.mkdir(parents=True)
    d.chmod(0o777)
    return d
