"""The stacked timeline's series (pure) and its picture (drawn, read back)."""
from slurm_plugin.cluster.timeline import plot_stacked, stacked

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
