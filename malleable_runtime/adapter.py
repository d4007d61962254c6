"""What a framework gives the runtime: its thread pools, resized in place, and a source of
wake-ups (control signals, a poll of the allowance). The core (``Runtime``) decides the counts
and their order against pinning; an adapter only applies them. TensorFlow's adapter is
``malleable_tf.pools`` (parking through its native library); a second framework implements these
two protocols beside it and reuses the rest of this package unchanged."""
from __future__ import annotations

from typing import Protocol


class ThreadPools(Protocol):
    """A process's two pools at their largest size; at least one thread of each stays active."""

    intra_pool: int   # the intra-op pool's size (the most threads it can run)
    inter_pool: int

    def resize(self, intra: int, inter: int, wait_s: float) -> None:
        """Run ``intra`` and ``inter`` threads from now on; when ``wait_s`` > 0, return once the
        threads beyond them have stopped (or after ``wait_s``), so the caller may narrow the
        CPU set next. Raises MalleableError when the framework refuses."""

    def release(self) -> None:
        """Let every thread run for good (the process is about to exit). Idempotent."""


class Wakeups(Protocol):
    """Signals routed to actions, and a poll of the allowance's files, read from one fd."""

    def install_signal(self, signo: int, action: int) -> int:
        """Route ``signo`` to ``action`` (an ``Action`` value); 0, or a negative errno."""

    def signal_fd(self) -> int:
        """The fd the watcher waits on: one byte per action."""

    def poll_paths(self, paths: bytes) -> None:
        """Watch these NUL-separated paths (and the affinity mask) for changes."""

    def poll_start(self, interval_us: int, pid: int, action: int) -> int:
        """Start polling every ``interval_us``; a change sends ``action``. 0, or a negative
        errno."""

    def stop(self) -> None:
        """Stop the poll. Idempotent."""
