"""Standard Workload Format logs as the Parallel Workloads Archive ships them: plain or gzip,
all 18 fields, the header kept, every line either simulated or dropped with a reason. The logs
are hand-made in the archive's format (tests/fixtures/swf/README.md)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from malleable_sim import (Adjustment, DropReason, SWFError, SWFRecord, parse_swf_text,
                                    read_swf, swf_workload)
from malleable_sim.workload import MissingLimit, limit_users_would_ask

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "swf"
PLAIN = FIXTURES / "handmade.swf"
GZIPPED = FIXTURES / "handmade.swf.gz"


def test_every_field_is_read_typed_and_the_header_is_kept():
    log = read_swf(PLAIN.read_bytes())
    assert len(log.records) == 15
    assert log.records[0] == SWFRecord(
        job=1, submit_s=0.0, wait_s=10.0, run_s=3600.0, allocated_procs=16, avg_cpu_s=3400.0,
        used_memory_kb=-1.0, requested_procs=16, requested_time_s=7200.0,
        requested_memory_kb=-1.0, status=1, user=1, group=1, executable=1, queue=1, partition=1,
        preceding_job=-1, think_time_s=-1.0)
    last = log.records[-1]
    assert (last.preceding_job, last.think_time_s, last.requested_procs) == (2, 60.0, -1)
    h = log.header
    assert (h.number("MaxProcs"), h.number("MaxNodes"), h.number("MaxRuntime")) == (128, 8, 86400)
    assert h.number("UnixStartTime") == 1_000_000_000 and h.number("MaxMemory") is None
    assert h.get("Version") == "2.2" and h.get("maxprocs") == "128"
    # A key may repeat (one Queue line per queue); the summary keeps the first.
    assert [v for k, v in h.entries if k == "Queue"] == ["1 batch", "2 wide"]
    assert h.summary()["Queue"] == "1 batch"


def test_gzip_is_recognised_by_its_magic_bytes_not_by_the_name(tmp_path):
    plain = read_swf(PLAIN.read_bytes())
    assert GZIPPED.read_bytes()[:2] == b"\x1f\x8b"
    assert read_swf(GZIPPED.read_bytes()) == plain
    renamed = tmp_path / "log.swf"      # compressed, named as plain text
    renamed.write_bytes(GZIPPED.read_bytes())
    assert read_swf(renamed.read_bytes()) == plain
    with pytest.raises(SWFError, match="gzip"):
        read_swf(GZIPPED.read_bytes()[:40])


def test_every_line_is_simulated_or_dropped_with_its_reason():
    w = swf_workload(read_swf(PLAIN.read_bytes()), nodes=8, cores=16)
    by_id = {j.job_id: j for j in w.jobs}
    assert sorted(by_id) == [1, 2, 4, 5, 8, 9, 10, 11]
    assert w.read == 15 == len(w.jobs) + sum(w.dropped.values())
    assert w.dropped == {
        DropReason.PARTIAL_EXECUTION.value: 2, DropReason.CANCELLED_BEFORE_START.value: 1,
        DropReason.NO_RUNTIME.value: 1, DropReason.NO_SUBMIT_TIME.value: 1,
        DropReason.NO_PROCESSORS.value: 1, DropReason.WIDER_THAN_CLUSTER.value: 1}
    assert w.adjusted == {Adjustment.TIME_LIMIT_FROM_RUNTIME.value: 1,
                          Adjustment.TIME_LIMIT_RAISED_TO_RUNTIME.value: 1,
                          Adjustment.PROCESSORS_FROM_ALLOCATED.value: 1}
    # The requested time is the limit backfill sees; the run time is what the job takes.
    assert (by_id[1].time_limit_s, by_id[1].expected_s, by_id[1].runtime_s) == (7200, 7200, 3600)
    assert by_id[4].time_limit_s == 600.0                      # none requested: its run time
    assert (by_id[5].cores, by_id[5].time_limit_s) == (4, 900.0)   # allocated; ran past 600
    # Jobs wider than a node keep their processors: nothing is capped to one node.
    assert (by_id[2].cores, by_id[8].cores) == (64, 128)
    assert by_id[9].runtime_s == 1200.0 and by_id[10].runtime_s == 0.0   # the summary line
    assert by_id[11].runtime_s == 450.0           # cancelled while it ran: it used the machine
    assert all(j.spec is None for j in w.jobs)
    # On a smaller cluster the whole-cluster job is too wide as well.
    small = swf_workload(read_swf(PLAIN.read_bytes()), nodes=4, cores=16)
    assert small.dropped[DropReason.WIDER_THAN_CLUSTER.value] == 2 and small.read == 15


def test_the_first_lines_only_and_malleability_drawn_per_job():
    log = read_swf(PLAIN.read_bytes())
    first = swf_workload(log, nodes=8, cores=16, first=4)
    assert [j.job_id for j in first.jobs] == [1, 2, 4] and first.read == 4
    mall = swf_workload(log, nodes=8, cores=16, malleable_fraction=1.0, seed=3)
    assert all(j.spec is not None and j.spec.max_cpus <= 16 for j in mall.jobs)
    assert swf_workload(log, nodes=8, cores=16, malleable_fraction=0.5, seed=3) == \
        swf_workload(log, nodes=8, cores=16, malleable_fraction=0.5, seed=3)


@pytest.mark.parametrize("text,message", [
    ("1 0 5\n", "line 1: 3 fields, an SWF line has 18"),
    ("; MaxProcs: 8\nx 0 5 10 1 -1 -1 1 10 -1 1 1 1 1 1 1 -1 -1\n", "line 2"),
    ("1 0 5 10 1.5 -1 -1 1 10 -1 1 1 1 1 1 1 -1 -1\n", "not a whole number"),
    ("1 0 5 10 1 -1 -1 1 10 -1 1 1 1 1 1 1 -1 -1 7\n", "19 fields")])
def test_bad_swf_text_is_a_clear_error(text, message):
    with pytest.raises(SWFError, match=message):
        parse_swf_text(text)


def test_integral_fields_written_as_decimals_are_read():
    rec = parse_swf_text("1 0.5 5 10.25 16.0 -1 -1 16 10 -1 1 1 1 1 1 1 -1 -1\n").records[0]
    assert (rec.submit_s, rec.run_s, rec.allocated_procs) == (0.5, 10.25, 16)


def test_the_command_line_reads_a_gzipped_log_and_counts_the_dropped(tmp_path, capsys):
    from malleable_sim.cli import main
    out = tmp_path / "out.json"
    assert main(["--swf", str(GZIPPED), "--nodes", "1", "--cores", "128",
                 "--policy", "static", "--malleable-fraction", "0", "--json", str(out)]) == 0
    row = json.loads(out.read_text())
    assert row["jobs"] == 8 and row["jobs_read"] == 15
    assert row["jobs_dropped"]["wider_than_cluster"] == 1
    assert row["jobs_dropped"]["cancelled_before_start"] == 1
    assert row["jobs_adjusted"]["time_limit_from_runtime"] == 1
    assert row["swf_header"]["MaxProcs"] == "128"
    empty = tmp_path / "empty.swf.gz"
    empty.write_bytes(gzip.compress(b"; MaxProcs: 4\n"))
    assert main(["--swf", str(empty), "--nodes", "1", "--cores", "4",
                 "--json", str(out)]) == 1      # a runtime error (2: usage errors only)
    assert "0 job lines read" in capsys.readouterr().err


def test_indented_header_lines_continue_the_entry_above():
    """As the archive writes them: a value carried on indented lines (a URL among them) belongs
    to its entry; an unindented line without a key is a note."""
    log = parse_swf_text("; Version: 2.2\n; Information: http://www.nas.nasa.gov/\n"
                         ";              http://www.cs.huji.ac.il/labs/parallel/workload/\n"
                         "; Note: There is no information on wait times - the given submit\n"
                         ";       times are actually start times\n;\n; a free note\n")
    assert list(log.header.entries) == [
        ("Version", "2.2"),
        ("Information", "http://www.nas.nasa.gov/ "
                        "http://www.cs.huji.ac.il/labs/parallel/workload/"),
        ("Note", "There is no information on wait times - the given submit times are "
                 "actually start times")]
    assert list(log.header.notes) == ["a free note"]


def test_a_job_without_a_requested_time_gets_the_popular_limit_its_run_fits_in():
    assert [limit_users_would_ask(s) for s in (0, 1, 60, 61, 599.5, 1801, 43200)] == \
        [60.0, 60.0, 60.0, 120.0, 600.0, 3600.0, 43200.0]
    assert limit_users_would_ask(43201) == limit_users_would_ask(46800) == 46800.0  # whole hours
    log = read_swf(b"1 0 -1 1801 4 -1 -1 4 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n")
    job, = swf_workload(log, nodes=1, cores=4, missing_limit=MissingLimit.POPULAR).jobs
    assert (job.runtime_s, job.time_limit_s) == (1801.0, 3600.0)
    job, = swf_workload(log, nodes=1, cores=4).jobs               # the default: the run time
    assert job.time_limit_s == 1801.0
