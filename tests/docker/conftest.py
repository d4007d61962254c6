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


@dataclass(frozen=True)
class DockerSlurm:
    project: str
    host_dir: Path         # the host side of /cluster
    suite: str
    prefix: str
    nodes: int

    @property
    def image(self) -> str:
        return f"malleable-slurm:{self.suite}"

    @property
    def controller(self) -> str:
        return f"{self.prefix}ctl"

    @property
    def node_names(self) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(1, self.nodes + 1)]

    def exec(self, host: str, argv: list[str], *, check: bool = True, timeout: float = 60,
             user: str | None = None) -> subprocess.CompletedProcess:
        """``argv`` in ``host``'s container (as ``user``), with the cluster's environment."""
        cmd = ["docker", "exec"] + (["-u", user] if user else []) + [f"{self.project}-{host}"]
        out = subprocess.run(cmd + argv, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} on {host} exited {out.returncode}: "
                                 f"{out.stderr.strip()[-2000:]}")
        return out

    def ctl(self, *argv: str, **kw) -> subprocess.CompletedProcess:
        return self.exec(self.controller, list(argv), **kw)

    def to_container(self, path: Path) -> str:
        """A path below the host's cluster folder, as the containers see it."""
        return "/cluster/" + str(Path(path).relative_to(self.host_dir))


@pytest.fixture(scope="session")
def docker_slurm() -> DockerSlurm:
    missing = [k for k in ("DOCKER_SLURM_PROJECT", "DOCKER_SLURM_DIR") if k not in os.environ]
    if missing:
        pytest.fail(f"run these tests with `make -C docker-slurm test` ({', '.join(missing)} unset)")
    return DockerSlurm(project=os.environ["DOCKER_SLURM_PROJECT"],
                       host_dir=Path(os.environ["DOCKER_SLURM_DIR"]),
                       suite=os.environ.get("DOCKER_SLURM_SUITE", "bookworm"),
                       prefix=os.environ.get("DOCKER_SLURM_PREFIX", "bw"),
                       nodes=int(os.environ.get("DOCKER_SLURM_NODES", "2")))


@pytest.fixture
def jobs_dir(docker_slurm: DockerSlurm, request) -> Path:
    """A folder for one test's job scripts and outputs, in the shared cluster folder."""
    d = docker_slurm.host_dir / "jobs" / request.node.name
    shutil.rmtree(d, ignore_errors=True)    # a stop file of an earlier run would end its job
    d.mkdir(parents=True)
    d.chmod(0o777)
    return d
