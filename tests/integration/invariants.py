"""The invariant checker the attack and fault tests run after each attack, over the real node:
the cgroup tree (no core in two jobs, every job within its bounds, step folders inside their
job's), the ranks (no rank runs more threads than its share of its job's cores), the agent
(alive), and files outside the job's folder (unchanged)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from malleable_protocol import parse_cpu_list, rank_share
from slurm_plugin.cluster import daemons
from slurm_plugin.node.cgroup_actuator import walk_job
from slurm_plugin.node.ranks import job_step_of, read_job_statuses
from slurm_plugin.feed import FeedStore

SENTINELS = [Path("/etc/passwd"), Path("/etc/shadow"), Path("/etc/hostname")]


def fingerprint(paths=SENTINELS) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.exists()}


def _cpus(path: Path) -> frozenset[int]:
    try:
        return parse_cpu_list(path.read_text())
    except (OSError, ValueError):
        return frozenset()


def node_jobs(layout) -> dict[int, tuple[int, Path]]:
    """Every job folder of the node's layout, with its owner."""
    out = {}
    for uid, parent in layout.job_parents():
        for job_dir in Path(parent).glob("job_*"):
            out[int(job_dir.name[4:])] = (job_dir.stat().st_uid if uid is None else uid, job_dir)
    return out


def violations(cluster, node: str, *, threads: bool = True) -> list[str]:
    """Every broken rule on ``node`` now (empty when all hold)."""
    problems = []
    feed = FeedStore(cluster.paths.root / "feed").read_node(node)
    owner: dict[int, int] = {}
    node_cores = frozenset(range(feed.cpus)) if feed else frozenset(range(os.cpu_count()))
    layout = cluster.cgroup_layout(node)
    for job_id, (uid, job_dir) in sorted(node_jobs(layout).items()):
        cpus = _cpus(job_dir / "cpuset.cpus")
        if not cpus:
            continue                       # being made or removed
        for c in cpus:
            if c in owner:
                problems.append(f"core {c} in jobs {owner[c]} and {job_id}")
            owner[c] = job_id
        if not cpus <= node_cores:
            problems.append(f"job {job_id} holds cores outside the node: {sorted(cpus)}")
        # Slurm's folders only, as the agent walks them: a job user may nest thousands of his own.
        for step in map(Path, walk_job(layout, str(job_dir))[0]):
            if not _cpus(step / "cpuset.cpus") <= cpus:
                problems.append(f"{step} outside its job's cores")
        fj = feed.job(job_id) if feed else None
        if fj is not None:
            if fj.spec is None and cpus != fj.allocation:
                problems.append(f"rigid job {job_id} moved: {sorted(cpus)} != "
                                f"{sorted(fj.allocation)}")
            if fj.spec is not None and len(cpus) > max(fj.spec.max_on(len(node_cores)),
                                                       fj.spec.min_cpus, len(fj.allocation)):
                problems.append(f"job {job_id} above its maximum: {len(cpus)}")
        if threads:
            for st in read_job_statuses(cluster.run_layout, job_id):
                if st.node != node or not cpus:
                    continue
                # Concurrent steps each hold their own block of the job's cores.
                step = job_step_of(st.pid, job_id, layout, uid)
                scope = (_cpus(job_dir / step / "cpuset.cpus") if step else cpus) or cpus
                share = rank_share(scope, st.local_rank, st.local_size)
                if st.intra_active > len(share):
                    problems.append(f"job {job_id} rank {st.rank}: {st.intra_active} threads "
                                    f"on {len(share)} cores")
    agent = next((r for r in cluster.records() if r.name == f"agent {node}"), None)
    if agent is None or not daemons.is_running(agent):
        problems.append(f"agent {node} is not running")
    return problems
