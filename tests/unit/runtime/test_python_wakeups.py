"""The pure-Python wake-ups (malleable_runtime.python_wakeups) with real signals, a real pipe and
real files: what the PyTorch adapter's runtime wakes on."""
import os
import select
import signal
import threading
import time

import pytest

from malleable_runtime.python_wakeups import PythonWakeups

SIG = signal.SIGRTMIN + 5     # a real-time signal nothing else in the test run uses


@pytest.fixture
def wakeups():
    previous = signal.getsignal(SIG)
    w = PythonWakeups()
    yield w
    w.stop()
    signal.signal(SIG, previous)


def read_codes(fd: int, timeout: float = 2.0) -> bytes:
    ready, _, _ = select.select([fd], [], [], timeout)
    return os.read(fd, 64) if ready else b""


def test_a_signal_writes_its_actions_code_after_the_main_thread_callback(wakeups):
    order = []
    wakeups.on_main_thread = lambda: order.append(threading.current_thread().name)
    assert wakeups.install_signal(SIG, 3) == 0
    os.kill(os.getpid(), SIG)
    time.sleep(0.01)            # the handler runs at the main thread's next bytecode
    assert read_codes(wakeups.signal_fd()) == b"\x03"
    assert order == ["MainThread"]


def test_a_wake_runs_the_main_thread_callback_without_a_signal(wakeups):
    ran = []
    wakeups.on_main_thread = lambda: ran.append(threading.current_thread().name)
    assert wakeups.wake_main_thread() is False       # no handler yet: nothing would run
    assert wakeups.install_signal(SIG, 1) == 0
    t = threading.Thread(target=wakeups.wake_main_thread)
    t.start()
    t.join()
    for _ in range(100):
        if ran:
            break
        time.sleep(0.001)
    assert ran == ["MainThread"]


def test_handlers_are_installed_from_the_main_thread_only(wakeups):
    out = []
    t = threading.Thread(target=lambda: out.append(wakeups.install_signal(SIG, 1)))
    t.start()
    t.join()
    assert out[0] < 0 and signal.getsignal(SIG) != wakeups._on_signal


def test_the_poll_wakes_on_a_file_change_and_on_the_affinity_mask(wakeups, tmp_path):
    f = tmp_path / "cpuset.cpus"
    f.write_text("0-1\n")
    wakeups.poll_paths(os.fsencode(f) + b"\0")
    assert wakeups.poll_start(2000, os.getpid(), 6) == 0
    time.sleep(0.05)
    assert read_codes(wakeups.signal_fd(), 0.05) == b""     # nothing changed: no wake
    f.write_text("0\n")
    assert read_codes(wakeups.signal_fd()) == b"\x06"
    mask = os.sched_getaffinity(0)
    if len(mask) < 2:
        pytest.fail("this test needs 2 CPUs to change the affinity mask")
    try:
        os.sched_setaffinity(0, {min(mask)})
        assert read_codes(wakeups.signal_fd()) == b"\x06"
    finally:
        os.sched_setaffinity(0, mask)
    assert wakeups.polls > 0 and wakeups.wakes >= 2   # the restore may be seen too
