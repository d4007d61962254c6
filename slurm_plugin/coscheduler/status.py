"""``malleable status``: per malleable job and node, Slurm's cores, the current cores, the bounds,
each rank's active threads and steps/s."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..cgroups import detect_version
from ..cpulist import format_cpu_list
from .cgroup_actuator import CpusetActuator, SlurmCgroupLayout
from .reconciler import job_spec_and_request
from .telemetry_reader import read_job_ranks


@dataclass
class StatusRow:
    job_id: int
    user: str
    node: str
    slurm_cpus: str
    current_cpus: str
    bounds: str
    requested: int | None
    threads: list[int]
    steps_per_s: list[float]

    def to_dict(self) -> dict:
        return asdict(self)


def collect_status(cluster) -> list[StatusRow]:
    config = cluster.agent_config()
    client = cluster.client()
    rows = []
    version = detect_version()
    for job in client.jobs():
        if not job.state.holds_cores:
            continue
        spec, requested = job_spec_and_request(job)
        for node, slurm in sorted(job.cpu_ids.items()):
            ranks = read_job_ranks(config.status_base, job.job_id, node) if spec else []
            cur = CpusetActuator(SlurmCgroupLayout(node, version)).current(job.uid, job.job_id)
            bounds = "-" if spec is None else \
                f"{spec.min_cpus}..{'node' if spec.max_cpus is None else spec.max_cpus}"
            rows.append(StatusRow(job.job_id, job.user, node, format_cpu_list(slurm),
                                  format_cpu_list(cur) if cur else "-", bounds, requested,
                                  [r.intra_active for r in ranks],
                                  [round(r.steps_per_s.get(r.intra_active, 0.0), 2) for r in ranks]))
    return rows


def format_table(rows: list[StatusRow]) -> str:
    head = f"{'JOB':>6} {'USER':<8} {'NODE':<6} {'SLURM':<8} {'NOW':<8} {'BOUNDS':<9} {'ASKED':>5}  THREADS/RANK  STEPS/S"
    lines = [head]
    for r in rows:
        lines.append(f"{r.job_id:>6} {r.user:<8} {r.node:<6} {r.slurm_cpus:<8} {r.current_cpus:<8} "
                     f"{r.bounds:<9} {r.requested if r.requested else '-':>5}  "
                     f"{','.join(map(str, r.threads)) or '-':<12}  "
                     f"{','.join(map(str, r.steps_per_s)) or '-'}")
    return "\n".join(lines)
