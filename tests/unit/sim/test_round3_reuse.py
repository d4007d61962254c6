"""Round 3's --reuse: an earlier run's cases stand for this run's only where the missing-limit
rule cannot have changed them (every job of the window records its requested time), or where
the earlier run used the same rule. Windows of the real logs: KTH records a request for every
job, NASA for none."""
from __future__ import annotations

from benchmarks.simulator.round3 import limits_all_requested, reusable

KTH = "KTH-SP2-1996-2.1-cln.swf.gz"
NASA = "NASA-iPSC-1993-3.1-cln.swf.gz"


def case(trace: str, missing: str | None) -> dict:
    c = {"trace": trace, "window_start": 505, "jobs_window": 100, "seed": 1, "load": 0.85,
         "node_costs": [], "regimes": {}}
    if missing is not None:     # round 3's first run wrote no rule: run_time
        c["missing_limit"] = missing
    return c


def test_which_windows_every_job_records_a_request_in() -> None:
    assert limits_all_requested(KTH, 505, 100)
    assert not limits_all_requested(NASA, 505, 100)


def test_a_case_under_the_other_rule_is_reused_only_where_the_rule_touches_no_job() -> None:
    got = reusable([case(KTH, None), case(NASA, None), case(NASA, "run_time")], "popular")
    assert [(c["trace"], c["missing_limit"]) for c in got] == [(KTH, "popular")]


def test_a_case_under_the_same_rule_is_reused_as_it_is() -> None:
    got = reusable([case(NASA, "popular")], "popular")
    assert got == [case(NASA, "popular")]
