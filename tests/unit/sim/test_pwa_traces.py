"""Real Parallel Workloads Archive logs (tests/fixtures/swf/pwa/SOURCES.md: where each came from,
its terms) read with the project's own reader. Every expected number below was counted from the
raw file with zcat and awk, not with the reader, for example

    zcat F | grep -vc '^;'                                          # job lines
    zcat F | awk '!/^;/ && $5 > 64 {n++} END {print n}'             # allocated processors > 64

and, for the counts of dropped lines, an awk program applying the rules of
``malleable_sim.workload._drop_reason`` in their order (partial execution; status 5 and
no run time; run time -1; submit time -1; neither processor field known; requested processors, or
the allocated ones where none are requested, above the cluster's cores)."""
from __future__ import annotations

import functools
import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from malleable_sim import Adjustment, DropReason, SWFLog, read_swf, swf_workload
from malleable_sim.workload import POPULAR_LIMITS_S

PWA = Path(__file__).resolve().parents[2] / "fixtures" / "swf" / "pwa"


@dataclass(frozen=True)
class Trace:
    name: str
    sha256: str                 # of the stored .swf.gz (SOURCES.md)
    job_lines: int
    version: str
    max_procs: int
    max_nodes: int
    first: tuple[int, float]    # (job number, submit time) of the first job line
    last: tuple[int, float]
    allocated_over: tuple[int, int]     # (P, job lines whose allocated processors exceed P)
    # A cluster of nodes x cores = P: what swf_workload makes of every line.
    cluster: tuple[int, int]
    jobs: int
    dropped: dict[str, int]
    adjusted: dict[str, int]


D, A = DropReason, Adjustment
TRACES = [
    Trace("NASA-iPSC-1993-3.1-cln",
          "5589ae9b2fb78e3bf92de097497cf33a91607de1ad54563e43533f7827597f29",
          job_lines=18239, version="2.2", max_procs=128, max_nodes=128,
          first=(1, 0.0), last=(42264, 7948936.0), allocated_over=(64, 420), cluster=(8, 8),
          jobs=17819, dropped={D.WIDER_THAN_CLUSTER.value: 420},
          # No requested processors or time anywhere in this log.
          adjusted={A.PROCESSORS_FROM_ALLOCATED.value: 17819,
                    A.TIME_LIMIT_FROM_RUNTIME.value: 17819}),
    Trace("KTH-SP2-1996-2.1-cln",
          "ca38b89067b6150d8ee172694e27a9e67194eef0d338b609a764d10608d50a14",
          job_lines=28476, version="2.2", max_procs=100, max_nodes=100,
          # The cleaning removed jobs 1-14; the submit times were not shifted.
          first=(15, 599850.0), last=(28490, 29363618.0), allocated_over=(64, 320),
          cluster=(4, 16),
          jobs=28155, dropped={D.NO_PROCESSORS.value: 1, D.WIDER_THAN_CLUSTER.value: 320},
          adjusted={A.TIME_LIMIT_RAISED_TO_RUNTIME.value: 471}),
    Trace("LLNL-Thunder-2007-1.1-cln",
          "df27b2ad62ef5ec1d02d592d48390ab2a8250265b9639bb5f0ebaa11f043ee38",
          job_lines=121039, version="2.2", max_procs=4008, max_nodes=1002,
          first=(1, 0.0), last=(128662, 12976987.0), allocated_over=(1024, 221),
          cluster=(256, 4), jobs=118533,
          dropped={D.CANCELLED_BEFORE_START.value: 172, D.NO_RUNTIME.value: 1190,
                   D.NO_PROCESSORS.value: 923, D.WIDER_THAN_CLUSTER.value: 221},
          adjusted={A.TIME_LIMIT_FROM_RUNTIME.value: 79977,
                    A.TIME_LIMIT_RAISED_TO_RUNTIME.value: 1101,
                    A.PROCESSORS_FROM_ALLOCATED.value: 4}),
    # Round 3's traces of multi-core nodes, simulated on their own machines' shapes.
    Trace("SDSC-BLUE-2000-4.2-cln",
          "9aab21f3cfa108f3ecefa52391b384d996dcf4216f920186f47a734646b2c658",
          job_lines=243306, version="2.2", max_procs=1152, max_nodes=144,
          first=(9, 430593.0), last=(250440, 84590739.0), allocated_over=(1152, 0),
          cluster=(144, 8), jobs=232540,
          dropped={D.CANCELLED_BEFORE_START.value: 10764, D.NO_RUNTIME.value: 2},
          adjusted={A.TIME_LIMIT_RAISED_TO_RUNTIME.value: 23434}),
    Trace("LLNL-Atlas-2006-2.1-cln",
          "48cc83b7a0490252aa1ae41a4b03dd598bc0683e146be94047febee36e7e0b36",
          job_lines=43778, version="2.2", max_procs=9216, max_nodes=1152,
          first=(1435, 3273240.0), last=(60332, 19951051.0), allocated_over=(9216, 0),
          cluster=(1152, 8), jobs=39139,
          dropped={D.CANCELLED_BEFORE_START.value: 4601, D.NO_PROCESSORS.value: 38},
          adjusted={A.TIME_LIMIT_FROM_RUNTIME.value: 6275,
                    A.TIME_LIMIT_RAISED_TO_RUNTIME.value: 3351}),
]
IDS = [t.name for t in TRACES]


@functools.cache
def _log(name: str) -> SWFLog:
    """Each log is read once for the whole module (Thunder, 121,039 lines, takes about a second)."""
    return read_swf((PWA / f"{name}.swf.gz").read_bytes())


@pytest.mark.parametrize("t", TRACES, ids=IDS)
def test_the_stored_file_is_the_one_sources_md_names(t):
    data = (PWA / f"{t.name}.swf.gz").read_bytes()
    assert data[:2] == b"\x1f\x8b"
    assert hashlib.sha256(data).hexdigest() == t.sha256
    assert t.sha256 in (PWA / "SOURCES.md").read_text()


@pytest.mark.parametrize("t", TRACES, ids=IDS)
def test_every_job_line_is_read_and_the_header_gives_the_machine(t):
    log = _log(t.name)
    assert len(log.records) == t.job_lines
    h = log.header
    assert h.get("Version") == t.version
    assert (h.number("MaxProcs"), h.number("MaxNodes")) == (t.max_procs, t.max_nodes)
    assert (log.records[0].job, log.records[0].submit_s) == t.first
    assert (log.records[-1].job, log.records[-1].submit_s) == t.last
    assert any("CLEANED VERSION" in v for k, v in h.entries if k == "Note")
    # No job is wider than the machine the header describes.
    assert max(max(r.allocated_procs, r.requested_procs) for r in log.records) <= t.max_procs


@pytest.mark.parametrize("t", TRACES, ids=IDS)
def test_wide_jobs_counted_in_the_raw_file_are_the_ones_the_reader_drops(t):
    log = _log(t.name)
    limit, wider = t.allocated_over
    assert sum(r.allocated_procs > limit for r in log.records) == wider
    nodes, cores = t.cluster
    assert nodes * cores == limit
    w = swf_workload(log, nodes=nodes, cores=cores)
    assert w.read == t.job_lines == len(w.jobs) + sum(w.dropped.values())
    assert len(w.jobs) == t.jobs
    assert {k: v for k, v in w.dropped.items() if v} == t.dropped
    assert {k: v for k, v in w.adjusted.items() if v} == t.adjusted
    assert all(j.cores <= limit for j in w.jobs)


def test_thunder_is_a_slurm_cluster_of_four_processor_nodes():
    log = _log("LLNL-Thunder-2007-1.1-cln")
    assert "Slurm" in log.header.get("Note")
    assert {r.allocated_procs % 4 for r in log.records if r.allocated_procs > 0} == {0}
    # Its first job asked for 156 processors and was given 472 (118 whole nodes).
    assert (log.records[0].requested_procs, log.records[0].allocated_procs) == (156, 472)


@pytest.mark.parametrize("name", ["NASA-iPSC-1993-3.1-cln", "KTH-SP2-1996-2.1-cln"])
def test_a_continued_information_line_is_not_a_key_of_its_own(name):
    entries = _log(name).header.entries
    assert "http" not in {k.lower() for k, _ in entries}
    info = [v for k, v in entries if k == "Information"]
    assert len(info) == 1 and "http://www.cs.huji.ac.il/labs/parallel/workload/" in info[0], info


def test_the_popular_limits_are_the_ones_users_ask_for_in_at_least_two_logs():
    """POPULAR_LIMITS_S, which jobs without a requested time take theirs from, is what the
    four logs that record requests say: the values among each log's 20 most requested (over
    the jobs it simulates) that at least two of them share."""
    tops = []
    for t in TRACES:
        if t.name.startswith("NASA"):       # no requested time anywhere
            continue
        w = swf_workload(_log(t.name), nodes=t.cluster[0], cores=t.cluster[1])
        simulated = {j.job_id for j in w.jobs}
        asked = Counter(r.requested_time_s for r in _log(t.name).records
                        if r.requested_time_s > 0 and r.job in simulated)
        tops.append({v for v, _ in asked.most_common(20)})
    shared = sorted(v for v in set().union(*tops) if sum(v in top for top in tops) >= 2)
    assert len(tops) == 4 and tuple(shared) == POPULAR_LIMITS_S
