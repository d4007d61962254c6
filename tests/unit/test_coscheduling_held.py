"""The co-scheduling benchmark's count of jobs that hold their cgroup after their last line."""
from benchmarks.cluster.coscheduling.run import held_after_end, held_after_end_summary


def run(mode: str, samples: list[tuple[float, str]]) -> dict:
    return {"job_mode": mode,
            "jobs": {"A": {"workload": "tf_data", "end": 10.0},
                     "B": {"workload": "keras_cnn", "end": 20.0}},
            "samples": [{"t": t, "job": j, "cores": 1} for t, j in samples]}


def test_held_is_the_last_sample_of_a_job_after_its_end():
    r = run("malleable", [(1.0, "A"), (16.5, "A"), (12.0, "A"), (20.4, "B")])
    assert held_after_end(r) == {"A": 6.5, "B": 0.4}


def test_a_job_never_sampled_is_left_out():
    assert held_after_end(run("plain", [(1.0, "A")])) == {"A": -9.0}


def test_the_summary_counts_by_workload_and_by_the_mode_the_job_ran_in():
    jobs = [{"name": "A", "malleable": True}, {"name": "B", "malleable": False}]
    long_ = run("malleable", [(16.5, "A"), (20.4, "B")])
    short = run("malleable", [(11.0, "A"), (20.4, "B")])
    summary = held_after_end_summary([(long_, jobs, "plain"), (short, jobs, "plain")])
    assert summary == {"tf_data malleable": {"runs": 2, "held": 1, "longest_s": 6.5},
                       "keras_cnn plain": {"runs": 2, "held": 0, "longest_s": 0.4}}
    # A repetition whose plain jobs ran without tf.data's autotuner: its rigid jobs say so.
    summary = held_after_end_summary([(short, jobs, "plain-noautotune")])
    assert set(summary) == {"tf_data malleable", "keras_cnn plain-noautotune"}
