"""malleable_torch's adapter without PyTorch: torch.set_num_threads replaced by a per-thread
setting (what PyTorch's is, ../shared/FACTS.md), so the test sees in which thread a resize lands."""
import threading
import time

from malleable_torch.threads import MAX_WAIT_S, TorchThreads


class PerThread:
    """A per-thread count, as OpenMP's nthreads-var is: 2 in every thread until set there."""

    def __init__(self, start: int = 2):
        self.start = start
        self.local = threading.local()
        self.calls: list[tuple[int, int]] = []    # (thread ident, n)

    def set(self, n: int) -> None:
        self.local.n = n
        self.calls.append((threading.get_ident(), n))

    def get(self) -> int:
        return getattr(self.local, "n", self.start)


def make(wake=lambda: True, start=2, pool=4):
    counts = PerThread(start)
    return TorchThreads(counts.set, counts.get, intra_pool=pool, wake_main_thread=wake), counts


def test_a_resize_in_the_training_thread_applies_at_once():
    threads, counts = make()
    threads.resize(1, 1, wait_s=0)
    assert counts.get() == 1 and threads.applied == 1
    assert counts.calls == [(threading.get_ident(), 1)]
    threads.resize(1, 1, wait_s=0)           # no change: nothing set again
    assert len(counts.calls) == 1


def test_a_resize_from_another_thread_waits_for_the_main_thread_to_apply_it():
    woken = []
    threads, counts = make(wake=lambda: woken.append(1) or True)
    done = threading.Event()

    def watcher():
        threads.resize(3, 1, wait_s=5)
        done.set()

    t = threading.Thread(target=watcher)
    t.start()
    assert not done.wait(0.2)                  # waits: the main thread has not applied it
    assert woken == [1] and counts.get() == 2
    threads.on_main_thread()                   # what the wake-ups' handler runs in main
    assert done.wait(2) and counts.get() == 3 and threads.applied == 3
    t.join()
    # It was set in this (the main) thread, not in the watcher's.
    assert counts.calls == [(threading.get_ident(), 3)]


def test_the_wait_ends_at_its_timeout_when_the_main_thread_is_busy():
    threads, counts = make()
    t0 = time.monotonic()
    out = []
    t = threading.Thread(target=lambda: out.append(threads.resize(1, 1, wait_s=0.3)))
    t.start()
    t.join(5)
    assert 0.25 < time.monotonic() - t0 < 3 and threads.applied == 2


def test_training_in_another_thread_gets_the_count_at_its_optimizer_step():
    woken = []
    threads, counts = make(wake=lambda: woken.append(1) or True)
    seen = {}
    stepped = threading.Event()
    go = threading.Event()

    def trainer():
        threads.training_thread_is_here()       # its first optimizer step
        stepped.set()
        go.wait(5)
        threads.training_thread_is_here()       # the next one
        seen["n"] = counts.get()

    t = threading.Thread(target=trainer)
    t.start()
    assert stepped.wait(5)
    t0 = time.monotonic()
    threads.resize(1, 1, wait_s=5)              # not the training thread, not main: no wait
    assert time.monotonic() - t0 < 1 and woken == []
    threads.on_main_thread()                    # a signal in main changes nothing here
    assert counts.get() == 2 and threads.applied == 2
    go.set()
    t.join(5)
    assert seen["n"] == 1 and threads.applied == 1


def test_a_long_wait_is_cut_to_max_wait():
    threads, counts = make()
    t0 = time.monotonic()
    t = threading.Thread(target=lambda: threads.resize(1, 1, wait_s=30))
    t.start()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < MAX_WAIT_S + 2
    threads.on_main_thread()            # the main thread's next bytecode applies it after all
    assert counts.get() == 1


def test_after_release_nothing_applies():
    threads, counts = make()
    threads.release()
    threads.resize(1, 1, wait_s=1)
    threads.training_thread_is_here()
    assert counts.calls == [] and counts.get() == 2
