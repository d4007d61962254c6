"""PyTorch's adapter to the runtime (``malleable_runtime.adapter.ThreadPools``).

PyTorch's intra-op thread count is a setting of the thread that runs the ops:
``torch.set_num_threads`` called in another thread leaves the training thread's parallelism as
it was (checked on torch 2.13: docs/FACTS.md). So a resize is not applied where the runtime
decides it (its watcher thread): it is posted here, and applied in the training thread at the
first of
- the main thread's next bytecode, through the wake-ups' handler (``PythonWakeups``,
  ``_thread.interrupt_main``): a training loop in the main thread follows within one op;
- the next optimizer step, in whatever thread calls it (``malleable_torch.hooks``);
- ``malleable_torch.step()`` or ``set_threads()`` called in the training thread.
When the training thread is the main thread (the usual script; the optimizer hook says otherwise)
``resize`` waits, up to ``wait_s`` (at most ``MAX_WAIT_S``), until the count is applied, so that
the runtime narrows the CPU set only after the threads beyond it have stopped (an op under way
keeps its threads until it returns: PyTorch cannot change a running parallel region). Otherwise
it returns at once, and the count applies at the next optimizer step.

What cannot follow (docs/pytorch.md): the inter-op pool (``torch.set_num_interop_threads``
works once, before inter-op work starts), so the runtime manages one inter-op "thread" and leaves
PyTorch's as they are; DataLoader workers, which are processes with their own threads.
"""
from __future__ import annotations

import threading
from typing import Callable


# The longest a resize waits for the training thread. An op under way keeps its threads until it
# returns; a main thread in a long C++ call (a DDP all-reduce waiting for a slow peer) must not
# hold the runtime's watcher (signals, status records) for the runtime's 5 s.
MAX_WAIT_S = 1.0


class TorchThreads:
    """The intra-op count of the training thread, set there; ``intra_pool``: the most it may be
    (OpenMP starts threads as a larger count asks for them)."""

    inter_pool = 1

    def __init__(self, set_num_threads: Callable[[int], None], get_num_threads: Callable[[], int],
                 *, intra_pool: int, wake_main_thread: Callable[[], bool]):
        self.intra_pool = intra_pool
        self._set = set_num_threads
        self._get = get_num_threads
        self._wake_main = wake_main_thread
        self._cond = threading.Condition()
        self._wanted = get_num_threads()
        self._applied = self._wanted           # what the training thread runs with
        self._training = threading.main_thread().ident   # until an optimizer step says otherwise
        self._released = False
        self.applied_count = 0                 # for tests and benchmarks: resizes applied

    @property
    def applied(self) -> int:
        return self._applied

    def resize(self, intra: int, inter: int, wait_s: float) -> None:
        with self._cond:
            if self._released:
                return
            self._wanted = intra
            if self._applied == intra:
                return
        if threading.get_ident() == self._training:
            self.apply_here()
            return
        if self._training != threading.main_thread().ident or not self._wake_main():
            return   # the next optimizer step applies it
        if wait_s > 0:
            with self._cond:
                self._cond.wait_for(lambda: self._applied == self._wanted or self._released,
                                    timeout=min(wait_s, MAX_WAIT_S))

    def apply_here(self) -> None:
        """In the training thread: run with the count last asked for."""
        with self._cond:
            wanted, released = self._wanted, self._released
        changed = not released and self._get() != wanted
        if changed:
            self._set(wanted)
        with self._cond:
            if not released:
                self._applied = wanted
            self.applied_count += changed
            self._cond.notify_all()

    def training_thread_is_here(self) -> None:
        """The optimizer steps in this thread: it is the training thread from now on (called at
        every step: cheap when nothing is posted)."""
        self._training = threading.get_ident()
        if self._wanted != self._applied:
            self.apply_here()

    def on_main_thread(self) -> None:
        """The wake-ups' handler, in the main thread: apply there if it is the training thread."""
        if self._training == threading.get_ident():
            self.apply_here()

    def release(self) -> None:
        """Nothing is parked: the threads stay as they are; no resize applies any more."""
        with self._cond:
            self._released = True
            self._cond.notify_all()
