"""Observe one node without asking slurmctld: the cluster's feed (bounds, requests, Slurm's
allocations, the node's size), the cgroup tree (which jobs run here and what they hold), the
node's ledger (allocations first seen, jobs starting, steps starting) and the ranks' status
records."""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Callable, Protocol

from malleable_protocol import RunLayout, format_cpu_list
from malleable_protocol.errors import printable

from slurm_plugin.feed.model import NodeFeed, Offers
from slurm_plugin.node.cgroup_actuator import CgroupJob, CpusetActuator
from slurm_plugin.node.ledger import FENCE_EXPIRY_S, STARTING_EXPIRY_S, Allocation, Ledger
from malleable_policy.model import JobView, NodeSnapshot, RankView, SiteLimits
from slurm_plugin.cgroups import StepdProcess, misplaced_jobs, process_cpuset, slurmstepd_processes
from slurm_plugin.node.ranks import RankReader, read_job_ranks
from slurm_plugin.topology import CpuNumbering, TopologyUnknown, check_against_slurm

log = logging.getLogger(__name__)


class FeedSource(Protocol):
    """Where the cluster-level view comes from (the FeedStore; a fake in tests)."""

    def read_node(self, node: str) -> NodeFeed | None: ...
    def read_offers(self, node: str) -> Offers | None: ...


class NodeObserver:
    def __init__(self, node: str, layout: RunLayout, feed: FeedSource, actuator: CpusetActuator,
                 *, max_cpus: int | None = None, limits: SiteLimits = SiteLimits(),
                 read_ranks: Callable = read_job_ranks,
                 wall: Callable[[], float] = time.time,
                 cpuset_of: Callable[[int], str | None] = process_cpuset,
                 stepds: Callable[[], list[StepdProcess]] = slurmstepd_processes,
                 placement_check_s: float = 5.0,
                 numbering: CpuNumbering | None = None, refusal: str | None = None):
        """``numbering``: how Slurm's abstract CPU ids (the feed's) name this node's CPUs; None
        takes them as Linux's (tests, and nodes built that way). ``refusal``: why the node's
        numbering could not be established (``TopologyUnknown``): then the feed's CPU ids are
        never used, and the reconciler holds every job to its allocation."""
        self.node = node
        self.max_cpus = max_cpus
        self.limits = limits          # the site's bounds on what jobs ask and claim
        self.layout = layout
        self.feed = feed
        self.actuator = actuator
        self._read_ranks = read_ranks
        self._wall = wall
        self._cpuset_of = cpuset_of
        self._stepds = stepds
        self.placement_check_s = placement_check_s
        self._placement: tuple[float, tuple[int, ...], tuple[str, ...]] | None = None
        self.numbering = numbering
        self._base_refusal = refusal
        self.refusal: str | None = refusal     # this cycle's: the base one or the feed's
        self.site_switched_off: str | None = None   # the feed's: the site's kill switch
        self.feed_malleable = False     # the node's feed lists a malleable job (node.quiet)

    def _refusal(self, feed: NodeFeed | None) -> str | None:
        """Why Slurm's CPU ids cannot be turned into this node's now, or None."""
        if self._base_refusal is not None or self.numbering is None:
            return self._base_refusal
        if feed is not None and feed.layout is not None:
            try:
                check_against_slurm(self.numbering, feed.layout)
            except TopologyUnknown as exc:
                return f"node {self.node}: {exc}"
        size = len(self.numbering.linux_of)
        top = max((max(j.allocation) for j in feed.jobs if j.allocation), default=-1) \
            if feed is not None else -1
        if feed is not None and (feed.cpus > size or top >= size):
            return (f"Slurm's feed names CPUs up to {max(feed.cpus - 1, top)} on node "
                    f"{self.node}, which has {size}")
        return None

    def _linux(self, abstract: frozenset[int]) -> frozenset[int]:
        return self.numbering.to_linux(abstract) if self.numbering is not None else abstract

    def node_cpus(self, feed: NodeFeed | None) -> frozenset[int]:
        if feed is not None and self.refusal is None:
            return self._linux(frozenset(range(feed.cpus)))
        # No feed yet: the CPUs slurmd's own cgroup folder may hand out.
        return self.actuator.node_cpus()

    def _peer_cap(self, nodes: tuple[str, ...], job_id: int) -> int | None:
        caps = []
        for other in nodes:
            if other == self.node:
                continue
            offers = self.feed.read_offers(other)
            if offers is not None and job_id in offers.per_rank:
                caps.append(offers.per_rank[job_id])
        return min(caps) if caps else None

    def _resolve_fences(self, ledger: Ledger, found: dict) -> set[int]:
        """Lift each fence whose step is set up (``SlurmCgroupLayout.step_set_up``), or whose
        slurmstepd is gone (the step failed or ended), or that is too old. Return the jobs
        still fenced."""
        now = self._wall()
        for (job_id, step), fence in list(ledger.fences.items()):
            cg = found.get(job_id)
            path = self._cpuset_of(fence.stepd_pid)
            if path is None or now - fence.since > FENCE_EXPIRY_S or \
                    self.actuator.layout.step_set_up(step, cg.folders if cg else {}, path, job_id):
                del ledger.fences[(job_id, step)]
        return ledger.fenced_jobs()

    def observe(self, ledger: Ledger) -> NodeSnapshot:
        """The node now. Updates ``ledger`` (first-seen allocations, start markers resolved)."""
        feed = self.feed.read_node(self.node)
        self.site_switched_off = feed.switched_off if feed is not None else None
        self.feed_malleable = feed is not None and any(j.spec is not None for j in feed.jobs)
        self.refusal = self._refusal(feed)
        # Refused: the feed's CPU ids may name other CPUs here; only the cgroups' count.
        ids_feed = feed if self.refusal is None else None
        # A folder of a job whose Epilog ran is no job (a user's cpusets kept Slurm from
        # removing it): its cores are free.
        scanned = self.actuator.scan()
        found = {j: cg for j, cg in scanned.items() if j not in ledger.ended}
        fenced = self._resolve_fences(ledger, found)
        views: list[JobView] = []
        fault_of: dict[int, str] = {}
        for job_id, cg in sorted(found.items()):
            fj = feed.job(job_id) if feed is not None else None
            known = ledger.allocations.get(job_id)
            # The owner: v1 names it in the path; v2's folders are root's, Slurm's feed says.
            uid = cg.uid if cg.uid is not None else fj.uid if fj is not None else \
                known.uid if known is not None else 0
            if fj is not None and ids_feed is not None:
                alloc = self._linux(fj.allocation)
                if known is None and not alloc <= cg.cpus:
                    fault_of[job_id] = self._disagreement(job_id, fj.allocation, alloc, cg)
                    alloc = cg.cpus     # slurmstepd's cpuset is the allocation in Linux ids
            elif known is not None and known.uid == uid:
                alloc = known.cpus
            else:
                alloc = cg.cpus     # first sight: the folder is still Slurm's allocation
            if known != Allocation(uid, alloc):
                ledger.allocations[job_id] = Allocation(uid, alloc)
            ledger.starting.pop(job_id, None)
            spec = fj.spec if fj is not None else None
            fault, ranks = self._job_input(job_id, uid, cg) if spec else (None, ())
            fault = fault_of.get(job_id, fault)
            if fault is not None:      # names its user chose, bound for root's logs
                fault = printable(fault)
            nodes = fj.nodes if fj is not None else (self.node,)
            view = JobView(
                job_id=job_id, uid=uid, user=fj.user if fj else str(uid),
                allocation=alloc, current=cg.cpus, spec=spec,
                requested=fj.requested if fj is not None else None, ranks=ranks,
                nodes=len(nodes), fenced=job_id in fenced, fault=fault,
                unsealed=cg.unsealed and not cg.cpus <= alloc,
                partition=fj.partition if fj is not None else "",
                steps=tuple(sorted({rel.split("/", 1)[0] for rel in cg.folders})),
                peer_cap_per_rank=self._peer_cap(nodes, job_id) if spec and len(nodes) > 1
                else None)
            views.append(replace(view, folders_in_line=cg.in_line(view.step_cpus(cg.cpus))))
        # Jobs Slurm placed here whose folder is not made yet: their cores are reserved. A stale
        # feed entry whose cores a running job's folder already holds is an ended job.
        held = frozenset().union(*(v.allocation | v.current for v in views))
        # Folders named by a SLUID whose job no slurmstepd tells yet (just made, or ending):
        # their cores are some job's; left out of the node's cores, so none is lent.
        unknown = self.actuator.unidentified
        unknown_cpus = frozenset().union(*unknown.values())
        held |= unknown_cpus
        listed = {fj.job_id for fj in feed.jobs} if feed is not None else set()
        for fj in (ids_feed.jobs if ids_feed is not None else ()):
            if fj.job_id in found or fj.job_id in ledger.ended:
                continue
            alloc = self._linux(fj.allocation)
            if alloc & held:
                continue
            views.append(JobView(job_id=fj.job_id, uid=fj.uid, user=fj.user,
                                 allocation=alloc, current=alloc,
                                 has_folder=False, nodes=len(fj.nodes)))
            held |= alloc
            ledger.starting.pop(fj.job_id, None)
        for job_id in [j for j in ledger.allocations if j not in found]:
            del ledger.allocations[job_id]          # ended
        now = self._wall()
        for job_id, since in list(ledger.starting.items()):
            if now - since > STARTING_EXPIRY_S:
                del ledger.starting[job_id]
        for job_id, since in list(ledger.ended.items()):
            if job_id not in scanned and (job_id not in listed or now - since > STARTING_EXPIRY_S):
                del ledger.ended[job_id]     # the feed has caught up, its folder is gone
        return NodeSnapshot(node=self.node, cpus=(self.node_cpus(feed) | held) - unknown_cpus,
                            jobs=tuple(views), pending_starts=tuple(sorted(ledger.starting)),
                            max_cpus=self.max_cpus, limits=self.limits,
                            problems=self._misplaced([v.job_id for v in views
                                                      if not v.has_folder])
                            + tuple(f"job folder {name} holds {format_cpu_list(cpus)}: no "
                                    "slurmstepd in it says which job it is (yet)"
                                    for name, cpus in sorted(unknown.items())))

    def _disagreement(self, job_id: int, abstract: frozenset[int], linux: frozenset[int],
                      cg: CgroupJob) -> str:
        """A job whose folder, first seen, does not hold what Slurm's ids map to: the node's
        numbering is not what this agent computed, or the folder was changed. Logged as the
        job's fault (held where slurmstepd put it): a folder its user may write is evidence
        against that job only."""
        log.error("job %s: Slurm's CPUs %s are %s here, but its cgroup holds %s: is this "
                  "node's CPU numbering (%s) what slurmd uses?", job_id,
                  format_cpu_list(abstract), format_cpu_list(linux), format_cpu_list(cg.cpus),
                  self.numbering.describe() if self.numbering else "Linux's")
        return (f"its cgroup holds {format_cpu_list(cg.cpus)}, not Slurm's "
                f"{format_cpu_list(linux)} (abstract {format_cpu_list(abstract)})")

    def _job_input(self, job_id: int, uid: int, cg: CgroupJob
                   ) -> tuple[str | None, tuple[RankView, ...]]:
        """What a malleable job's user controls (its records, the folders below its cgroup),
        read within its budget. The failure boundary: whatever they hold, the error is this
        job's fault (it is held to its allocation), never the cycle's."""
        if cg.foreign:
            return f"folders Slurm did not make below its cgroup: {', '.join(cg.foreign)}", ()
        if isinstance(self._read_ranks, RankReader):
            self._read_ranks.charge_cpu(uid, cg.scan_cpu_s)   # his folders: his budget too
        try:
            return None, self._read_ranks(self.layout, job_id, uid, self.actuator.layout)
        except Exception as exc:  # noqa: BLE001 - any error on a job's input is confined to it
            return f"{type(exc).__name__}: {str(exc)[:200]}", ()

    def _misplaced(self, folderless: list[int]) -> tuple[str, ...]:
        """For jobs Slurm placed here that have no folder where the layout says: is one of
        them in a folder of its own elsewhere (a layout other than the one discovered)? Reads
        /proc only when there are such jobs, at most every ``placement_check_s``."""
        if not folderless:
            self._placement = None
            return ()
        now, key = self._wall(), tuple(folderless)
        if self._placement is None or self._placement[1] != key or \
                now - self._placement[0] >= self.placement_check_s:
            found = misplaced_jobs(self.actuator.layout, folderless, self._stepds())
            self._placement = (now, key, tuple(found[j] for j in sorted(found)))
        return self._placement[2]
