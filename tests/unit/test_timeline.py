"""The stacked timeline's series (pure) and its picture (drawn, read back)."""
from slurm_plugin.timeline import plot_stacked, stacked

SAMPLES = [
    {"t": 0, "job": 1, "node": "n1", "cores": 2},
    {"t": 1, "job": 1, "node": "n1", "cores": 1}, {"t": 1, "job": 2, "node": "n1", "cores": 1},
    {"t": 2, "job": 2, "node": "n1", "cores": 2},                      # job 1 gone from n1
    {"t": 1, "job": 1, "node": "n2", "cores": 2},
]


def test_each_job_has_a_count_at_every_time_the_node_was_seen():
    times, cores = stacked(SAMPLES, "n1", [1, 2, 3])
    assert times == [0.0, 1.0, 2.0]
    # Stacked, the top is the node's total: 2, 2, 2; job 2 was under job 1's line at t=1.
    assert cores == {1: [2, 1, 0], 2: [0, 1, 2], 3: [0, 0, 0]}
    assert stacked(SAMPLES, "n2", [1, 2]) == ([1.0], {1: [2], 2: [0]})
    assert stacked(SAMPLES, "n3", [1]) == ([], {1: []})


def test_the_picture_is_drawn(tmp_path):
    png = tmp_path / "t.png"
    plot_stacked(SAMPLES, {1: "A", 2: "B"}, png, cores_per_node=2, title="t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def _event(**kw):
    import json
    return json.dumps(kw)


def test_samples_from_the_agents_event_logs():
    """A job's band from its events: its allocation from its start (the job-usage line, written
    at its end), each applied resize, 0 at its end; every change observes every job then on the
    node; with jobs named, only their nodes over their time there, with the jobs beside them."""
    from slurm_plugin.timeline import samples_from_events
    lines = [
        _event(event="grow", job=1, node="n1", before="0", after="0-1", status="applied",
               time=101.0),
        _event(event="shrink", job=1, node="n1", before="0-1", after="0", status="applied",
               time=110.0),
        _event(event="grow", job=1, node="n1", after="0-3", status="failed", time=111.0),
        "not json", _event(event="feed-catching-up", node="n1", time=100.5),
        _event(event="job-usage", job=2, node="n1", start=110.0, end=120.0, allocation=1),
        _event(event="job-usage", job=1, node="n1", start=100.0, end=130.0, allocation=1),
        _event(event="job-usage", job=3, node="n2", start=200.0, end=210.0, allocation=4),
    ]
    samples = samples_from_events(lines, [1])
    assert {s["node"] for s in samples} == {"n1"}       # job 3's node is not job 1's
    times, cores = stacked(samples, "n1", [1, 2])
    assert times == [0.0, 1.0, 10.0, 20.0, 30.0]
    assert cores == {1: [1, 2, 1, 1, 0], 2: [0, 0, 1, 0, 0]}
    everything = samples_from_events(lines)
    assert stacked(everything, "n2", [3]) == ([100.0, 110.0], {3: [4, 0]})
