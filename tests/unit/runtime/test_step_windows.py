"""Steps/s windowing (telemetry.StepWindows) on a fake clock, and the runtime's step count
(step(), step sources, resizes, the status record) with the native library replaced by fakes."""
import json
import random

from malleable_runtime.runtime import Runtime
from malleable_runtime.telemetry import StepWindow, StepWindows

from ..fakes import World, fake_tf_adapter


def run(w: StepWindows, events):
    """events: (time, total, threads) observations; returns every window closed."""
    out = []
    for now, total, threads in events:
        out += w.observe(now, total, threads)
    return out


def timed(windows):
    return [(x.threads, x.steps, round(x.seconds, 6)) for x in windows if x.seconds > 0]


def test_steady_steps_make_windows_of_window_s_and_first_steps_are_not_timed():
    w = StepWindows(window_s=2.0)
    # 10 steps/s, observed every 0.5 s; the first 3 steps include tracing: counted, not timed.
    events = [(0.0, 0, 4)] + [(0.5 * i, 3 + 5 * (i - 1), 4) for i in range(1, 10)]
    out = run(w, events)
    assert out[0] == StepWindow(4, 3, 0.0)
    assert timed(out) == [(4, 20, 2.0), (4, 20, 2.0)]   # 10 steps/s


def test_a_resize_closes_the_window_and_credits_the_old_thread_count():
    w = StepWindows(window_s=2.0)
    out = run(w, [(0.0, 0, 4), (0.5, 1, 4), (1.0, 11, 4), (1.3, 17, 2), (1.5, 19, 2),
                  (2.0, 24, 2), (3.5, 39, 2)])
    assert timed(out) == [(4, 16, 0.8), (2, 22, 2.2)]


def test_a_resize_after_the_last_step_ends_the_window_at_that_step():
    w = StepWindows(window_s=2.0)
    out = run(w, [(0.0, 0, 4), (0.5, 1, 4), (1.0, 6, 4), (1.2, 6, 4), (1.4, 6, 1)])
    assert timed(out) == [(4, 5, 0.5)]   # 0.5 .. 1.0, not .. 1.4


def test_the_end_of_a_phase_closes_the_window_at_its_last_step():
    w = StepWindows(window_s=2.0)
    out = run(w, [(0.0, 0, 2), (0.5, 1, 2), (1.0, 6, 2), (1.5, 10, 2), (2.0, 10, 2),
                  (3.0, 10, 2), (3.5, 10, 2)])
    assert timed(out) == [(2, 9, 1.0)]
    assert sum(x.steps for x in out) == 10   # every step reaches the status record


def test_steps_after_a_long_pause_are_counted_not_timed():
    w = StepWindows(window_s=2.0, idle_steps=4.0)
    ev = [(0.0, 0, 2), (0.5, 1, 2)] + [(0.5 + 0.5 * i, 1 + 5 * i, 2) for i in range(1, 5)]
    ev += [(4.0, 21, 2), (30.0, 21, 2), (30.5, 24, 2)]      # an evaluation of ~27 s
    ev += [(30.5 + 0.5 * i, 24 + 5 * i, 2) for i in range(1, 5)]
    out = run(w, ev)
    assert (2, 3, 0.0) in [(x.threads, x.steps, x.seconds) for x in out]
    assert timed(out) == [(2, 20, 2.0), (2, 20, 2.0)]    # the pause is in no timed window
    assert sum(x.steps for x in out) == 44


def test_steps_slower_than_the_sampler_are_timed_between_them():
    w = StepWindows(window_s=2.0)
    # A step every 3 s (observed every 0.5 s): each window runs from one step to the next.
    ev = [(0.0, 0, 1)]
    t, total = 0.0, 0
    for _ in range(40):
        t += 0.5
        if t % 3.0 == 0:
            total += 1
        ev.append((t, total, 1))
    out = run(w, ev)
    assert out[0].seconds == 0.0     # the first step
    assert timed(out) and all(x == (1, 1, 3.0) for x in timed(out))


def test_a_bad_guess_of_step_time_is_undone():
    w = StepWindows(window_s=2.0, idle_steps=4.0)
    # A resize right after a step leaves a window of 1 step in 0.01 s; steps take 3 s.
    ev = [(0.0, 0, 2), (3.0, 1, 2), (6.0, 2, 2), (6.01, 3, 2), (6.02, 3, 1), (9.0, 4, 1),
          (12.0, 5, 1), (15.0, 6, 1)]
    out = run(w, ev)
    assert timed(out)[-2:] == [(1, 1, 3.0), (1, 1, 3.0)]


def test_the_count_never_goes_back_and_flush_closes_the_open_window():
    w = StepWindows(window_s=2.0)
    out = run(w, [(0.0, 0, 2), (0.5, 1, 2), (1.0, 5, 2), (1.2, 0, 2), (1.4, 7, 2)])
    out += w.observe(1.5, 7, 2, flush=True)
    assert timed(out) == [(2, 6, 0.9)]
    assert sum(x.steps for x in out) == 7


def test_every_step_is_in_exactly_one_window_whatever_the_order_of_events():
    r = random.Random(7)
    for _ in range(200):
        w = StepWindows(window_s=r.choice([0.5, 2.0]))
        t, total, out = 0.0, 0, []
        for _ in range(r.randint(1, 60)):
            t += r.choice([0.0, 0.01, 0.5, 0.5, 3.0, 40.0])
            total += r.choice([0, 0, 1, 5, 50])
            out += w.observe(t, total, r.choice([1, 2, 2, 2]))
        out += w.observe(t + 1, total, 2, flush=True)
        assert sum(x.steps for x in out) == total
        assert all(x.steps > 0 and x.seconds >= 0 for x in out)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make_runtime(tmp_path, clock, pool=2):
    w = World(set(range(pool)))
    rt = Runtime(*fake_tf_adapter(w.calls, pool), local_rank=0,
                 local_size=1, read_affinity=lambda: w.mask, cgroup=w, pin=w.pin, clock=clock,
                 status_path=tmp_path / "status.json")
    rt.set_threads(reason="init")
    return rt


def status(rt):
    return json.loads(rt.status_path.read_text())


def test_runtime_counts_step_calls_and_sources_and_credits_resizes(tmp_path):
    clock = Clock()
    rt = make_runtime(tmp_path, clock)
    graph = [0]   # what a TF variable would hold
    rt.add_step_source(lambda: graph[0])
    rt.sample_steps()                    # the first observation opens the window
    clock.now, graph[0] = 1.0, 3         # tracing: counted, not timed
    rt.sample_steps()
    for _ in range(4):                   # 10 steps/s at 2 threads: 5 from each source
        clock.now += 0.5
        graph[0] += 3
        rt.step(2)
        rt.sample_steps()
    assert status(rt)["steps_per_s"] == {"2": 10.0} and status(rt)["steps"] == 23
    clock.now += 0.25
    rt.step(2)
    rt.set_threads(intra=1)              # the window closes on the resize: 2 steps at 2 threads
    assert status(rt)["steps"] == 25 and status(rt)["intra_active"] == 1
    for _ in range(4):
        clock.now += 0.5
        rt.step(2)
        rt.sample_steps()
    assert status(rt)["steps_per_s"]["1"] == 4.0 and status(rt)["steps"] == 33
    rt.step(1)
    rt.close()                           # the last step reaches the status record
    assert status(rt)["steps"] == 34


def test_a_failing_source_keeps_its_last_value(tmp_path):
    clock = Clock()
    rt = make_runtime(tmp_path, clock)
    values = iter([0, 5, RuntimeError("gone"), 9])

    def read():
        v = next(values)
        if isinstance(v, Exception):
            raise v
        return v

    rt.add_step_source(read)
    assert [rt.steps_total() for _ in range(4)] == [0, 5, 5, 9]


def test_a_failing_status_write_is_logged_once_until_it_works_again(tmp_path, caplog):
    from malleable_tf import ThreadState
    from malleable_runtime.telemetry import Telemetry
    blocker = tmp_path / "records"
    blocker.write_text("a file where the records' folder should be")
    t = Telemetry(rank=0, local_rank=0, local_size=1, status_path=blocker / "0.json")
    record = t.record(ThreadState(1, 2, 1, 2, frozenset({0}), frozenset({0}), True))
    with caplog.at_level("WARNING", logger="malleable_runtime.telemetry"):
        for _ in range(50):     # a job writes several times a second; an uninstall removed it
            t.write(record)
        assert len(caplog.records) == 1
        assert "cannot write status" in caplog.records[0].getMessage()
        blocker.unlink()
        t.write(record)
        t.write(record)
    assert (blocker / "0.json").exists()
    assert len(caplog.records) == 2 and "again" in caplog.records[1].getMessage()
