"""The live resizing runtime of one training process, whatever its framework.

``Runtime`` owns the target thread counts and applies them: it resizes the framework's pools
through its adapter (``adapter.ThreadPools``), pins the process's threads to this rank's share of the allowed CPUs, and, when
following, re-reads the allowance whenever the native poller sees the affinity mask or a cgroup
file change (``adapter.Wakeups``), on every control signal, and once a second as a safety
net. It also keeps the
running count of training steps (``step``, sources such as the optimizer counter) and credits
them to the intra-op thread count in force. Nothing starts in the constructor: ``start_watcher``
starts the Python watcher thread, the native poller and the step sampler.

The parts it wires together: ``control`` (signals, the target file, the watcher thread),
``allowance.AllowanceFollower`` (what the allowance is now) and ``telemetry`` (the status record);
what it reports is a ``state.ThreadState``. The API's front door is the package, not this module.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

from malleable_protocol import RankStatus, ResizeEvent, Target, format_cpu_list

from . import allowance as allow
from . import control
from . import telemetry
from .adapter import ThreadPools, Wakeups
from .control import Action
from .state import ThreadState

log = logging.getLogger(__name__)


class MalleableError(RuntimeError):
    pass


class NotInitialized(MalleableError):
    def __init__(self) -> None:
        super().__init__("malleable_tf.init() has not run (or shutdown() has)")


def thread_ids(pid: int | str = "self") -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [threading.get_native_id()] if pid == "self" else []


def pin_all_threads(cpus: frozenset[int], pid: int | str = "self") -> int:
    """Set the affinity of every thread of a process, this one by default (what
    ``taskset -a -p`` does; threads created later inherit their creator's mask). Returns how
    many threads refused (a thread that just exited does not count); each refusal is logged."""
    refused = 0
    for tid in thread_ids(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            pass  # a thread that just exited
        except OSError as exc:   # EINVAL: CPUs outside the cpuset; EPERM: not ours
            refused += 1
            log.warning("malleable: cannot pin thread %d to %s: %s", tid,
                        format_cpu_list(cpus), exc)
    return refused


class Runtime:
    def __init__(self, pools: ThreadPools, wakeups: Wakeups, *, local_rank: int,
                 local_size: int, rank: int = 0, follow: bool = True, poll_interval_s: float = 0.005,
                 recheck_interval_s: float = 1.0,
                 status_path: Path | None = None, target_path: Path | None = None,
                 read_affinity: Callable[[], frozenset[int]] = lambda: allow.read_affinity(os.getpid()),
                 cgroup: allow.CgroupReader | None = None, mask_restricts: bool = True,
                 pin: Callable[[frozenset[int]], None] = pin_all_threads,
                 pin_share: bool = True, node: str = "",
                 clock: Callable[[], float] = time.monotonic, sample_interval_s: float = 0.5):
        self.pools = pools
        self._wakeups = wakeups
        self.intra_pool = intra_pool = pools.intra_pool
        self.inter_pool = inter_pool = pools.inter_pool
        self.local_rank, self.local_size, self.rank = local_rank, local_size, rank
        self.follow = follow
        # The native poll (a few syscalls, no GIL) runs every poll_interval_s; the Python
        # watcher re-reads everything itself every recheck_interval_s (and finds cgroup moves).
        self.poll_interval_s = poll_interval_s
        self.recheck_interval_s = recheck_interval_s
        self._polled_paths: tuple[Path, ...] | None = None
        self.target_path = target_path
        self._cgroup = cgroup or allow.CgroupReader()
        self._pin = pin
        # Pin the threads to this rank's share of the allowance (locality), or to the whole
        # allowance (ranks float over their node's cores; the thread counts are the same).
        self.pin_share = pin_share
        self._clock = clock
        self._lock = threading.RLock()
        self._closed = False
        # What was asked (API, signals, target file); the effective count is capped by the share.
        self._want_intra = intra_pool
        self._want_inter = inter_pool
        self._intra = intra_pool
        self._inter = inter_pool
        self._follower = allow.AllowanceFollower(read_affinity, self._cgroup,
                                                 mask_restricts=mask_restricts)
        self._share = self._follower.current.cpus
        self._telemetry = telemetry.Telemetry(rank=rank, local_rank=local_rank,
                                              local_size=local_size, status_path=status_path,
                                              node=node)
        # The co-scheduler's Target for this job on this node: the cores the job holds there,
        # or is about to hold (a shrink parks threads before the cpuset narrows).
        self._target: Target | None = None
        self._watcher: control.Watcher | None = None
        # Steps: the package's step() and running totals read from elsewhere (the optimizer
        # counter, a TF variable), cut into windows on every resize and by the sampler.
        self._step_counter = telemetry.StepCounter()
        self._step_sources: list[Callable[[], int]] = []
        self._source_totals: list[int] = []
        self._windows = telemetry.StepWindows()
        self.sample_interval_s = sample_interval_s
        self._sampler: telemetry.StepSampler | None = None
        # True once the adapter counts every optimizer step itself (malleable_tf.keras: each Keras
        # optimizer's apply_gradients): its callback then leaves the counting to it.
        self.counts_optimizer_steps = False

    # --- state ---------------------------------------------------------------------------

    @property
    def status_path(self) -> Path | None:
        return self._telemetry.status_path

    @status_path.setter
    def status_path(self, path: Path | None) -> None:
        self._telemetry.status_path = path

    def state(self) -> ThreadState:
        with self._lock:
            return ThreadState(self._intra, self.intra_pool, self._inter, self.inter_pool,
                               self._follower.current.cpus, self._share, self.follow)

    def _check_open(self) -> None:
        if self._closed:
            raise NotInitialized()

    # --- resizing ------------------------------------------------------------------------

    def _validate(self, name: str, value: int | None, pool: int) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        if not 1 <= value <= pool:
            raise ValueError(f"{name}={value} outside 1..{pool} (the pool size set at init; "
                             "at least one thread always stays active)")
        return value

    def set_threads(self, intra: int | None = None, inter: int | None = None, *,
                    reason: str = "api", wait_s: float = 5.0) -> ThreadState:
        intra = self._validate("intra", intra, self.intra_pool)
        inter = self._validate("inter", inter, self.inter_pool)
        with self._lock:
            self._check_open()
            if intra is not None:
                self._want_intra = intra
            if inter is not None:
                self._want_inter = inter
            self._apply(reason, wait_s)
            return self.state()

    def refresh_allowance(self, reason: str = "allowance", wait_s: float = 5.0) -> bool:
        """Re-read the allowance; apply when it changed. True when something changed."""
        with self._lock:
            if self._closed or not self.follow:
                return False
            if not self._follower.refresh():
                return False
            self._apply(reason, wait_s)
            return True

    def _apply(self, reason: str, wait_s: float) -> None:
        t0 = self._clock()
        if self.follow:
            allowed = self._follower.effective(self._target)
            share = allow.share_of(allowed, self.local_rank, self.local_size)
        else:
            share = self._share
        cap = len(share) if self.follow else max(self.intra_pool, self.inter_pool)
        intra = max(1, min(self._want_intra, cap, self.intra_pool))
        inter = max(1, min(self._want_inter, cap, self.inter_pool))
        before = (self._intra, self._inter)
        grow = len(share) >= len(self._share)
        # Growing: widen the CPU set first, then wake threads. Shrinking: park first, then
        # narrow, so the process never has more running threads than cores.
        pin_set = share if not self.follow or self.pin_share else allowed.cpus
        if self.follow and grow:
            self._pin_to(pin_set)
        self.pools.resize(intra, inter, wait_s)
        if self.follow and not grow:
            self._pin_to(pin_set)
        self._share = share
        self._intra, self._inter = intra, inter
        if before[0] != intra:
            self._observe_steps()   # the window closes: its steps belong to the old count
        latency_ms = (self._clock() - t0) * 1000
        if before != (intra, inter):
            self._telemetry.resized(ResizeEvent(time.time(), before[0], intra, before[1], inter,
                                                reason, round(latency_ms, 3)))
            # Rank 0's at INFO; every other rank's at DEBUG (one line per rank per resize).
            log.log(logging.INFO if self.rank == 0 else logging.DEBUG,
                    "malleable: rank %d resize intra %d->%d inter %d->%d cpus=%s reason=%s "
                    "latency=%.2fms", self.rank, before[0], intra, before[1], inter,
                    format_cpu_list(share), reason, latency_ms)
        self.write_status()

    def _pin_to(self, share: frozenset[int]) -> None:
        """Pin to ``share`` unless already there; the follower must know our own pinning, so
        as not to take it for a restriction from outside."""
        if share != self._follower.pinned:
            self._pin(share)
            self._follower.pinned = share

    # --- steps/s and telemetry -------------------------------------------------------------

    def record_steps(self, steps: int, seconds: float, threads: int | None = None) -> None:
        """Credit ``steps`` done in ``seconds`` to ``threads`` intra-op threads (default: now)."""
        with self._lock:
            self._telemetry.record_steps(self._intra if threads is None else threads, steps,
                                         seconds)

    def step(self, n: int = 1) -> None:
        """Count ``n`` training steps done just now (cheap: no runtime lock)."""
        self._step_counter.add(n)

    def add_step_source(self, read: Callable[[], int]) -> None:
        """Count the steps of ``read()``, a running total (read by the sampler and on resizes;
        a failed read keeps the last value)."""
        with self._lock:
            self._step_sources.append(read)
            self._source_totals.append(0)

    def steps_total(self) -> int:
        with self._lock:
            for i, read in enumerate(self._step_sources):
                try:
                    self._source_totals[i] = int(read())
                except Exception as exc:  # noqa: BLE001 - a user's step source may raise anything
                    log.debug("malleable: step source %r: %s", read, exc)
            return self._step_counter.total + sum(self._source_totals)

    def sample_steps(self, *, flush: bool = False) -> None:
        """Observe the step count now; write the status record when a window closed.
        ``flush`` closes the open window too (an epoch's end, shutdown)."""
        with self._lock:
            if self._observe_steps(flush=flush):
                self.write_status()

    def _observe_steps(self, *, flush: bool = False) -> bool:
        windows = self._windows.observe(self._clock(), self.steps_total(), self._intra,
                                        flush=flush)
        for w in windows:
            self._telemetry.record_steps(w.threads, w.steps, w.seconds)
        return bool(windows)

    def status_record(self) -> RankStatus:
        with self._lock:
            return self._telemetry.record(self.state())

    def write_status(self) -> None:
        if self.status_path is not None:
            self._telemetry.write(self.status_record())

    # --- control signals and the watcher ---------------------------------------------------

    def handle(self, action: Action) -> None:
        with self._lock:
            if self._closed:
                return
            if action is Action.RELOAD:
                before = self._target
                self.load_target()
                self._cgroup.invalidate()  # "look again" includes where our cgroup files are
                if not self.refresh_allowance(reason="signal") and self._target != before \
                        and self.follow:
                    self._apply("target-file", 5.0)
                return
            if action is Action.ALLOWANCE:
                return  # the watcher re-reads the allowance after every wake
            step = {Action.INTRA_UP: (1, 0), Action.INTRA_DOWN: (-1, 0),
                    Action.INTER_UP: (0, 1), Action.INTER_DOWN: (0, -1)}[action]
            intra = min(self.intra_pool, max(1, self._want_intra + step[0]))
            inter = min(self.inter_pool, max(1, self._want_inter + step[1]))
            self.set_threads(intra, inter, reason=f"signal:{action.name.lower()}")

    def load_target(self) -> None:
        """Read the co-scheduler's Target. A bad or missing file is reported (bad) and changes
        nothing."""
        if self.target_path is None:
            return
        target = control.load_target(self.target_path)
        if target is not None:
            self._target = target

    def install_signals(self, mapping: Mapping[int, Action]) -> None:
        """Route each signal to its action. Only then does the status record name the reload
        signal, the one the agent sends: its default action may end the process."""
        for signo, action in mapping.items():
            rc = self._wakeups.install_signal(int(signo), action.value)
            if rc != 0:
                raise MalleableError(f"cannot install handler for signal "
                                     f"{control.signal_name(signo)}: {os.strerror(-rc)}")
        with self._lock:
            self._telemetry.reload_signal = control.announced_reload_signal(mapping)

    def start_watcher(self) -> None:
        if self._watcher is not None:
            return
        if self.follow:
            self._arm_poller()
            rc = self._wakeups.poll_start(int(self.poll_interval_s * 1e6), os.getpid(),
                                          Action.ALLOWANCE.value)
            if rc != 0:
                raise MalleableError(f"cannot start the allowance poller: {-rc}")
        self._watcher = control.Watcher(self._wakeups.signal_fd(),
                                        self.recheck_interval_s, self.handle, self._after_wake)
        self._watcher.start()
        self._sampler = telemetry.StepSampler(self.sample_steps, self.sample_interval_s)
        self._sampler.start()

    def _after_wake(self, timed_out: bool) -> None:
        """After the watcher's actions: a wake re-reads the allowance (a timeout already did,
        as a reload), then the poller follows a cgroup move."""
        if not timed_out:
            self.refresh_allowance()
        if self.follow:
            self._arm_poller()

    def _arm_poller(self) -> None:
        """Point the native poller at this process's cgroup files (again, after a move)."""
        paths = tuple(self._cgroup.watched_paths())
        if paths != self._polled_paths:
            joined = b"\0".join(os.fsencode(p) for p in paths)
            self._wakeups.poll_paths(joined)
            self._polled_paths = paths

    def close(self) -> None:
        """Release every parked thread for good and stop the watcher. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._sampler is not None:
            self._sampler.stop()
        try:
            self.sample_steps(flush=True)   # the last steps reach the status record
        except Exception as exc:  # noqa: BLE001 - at exit, a step source may be gone already
            log.debug("malleable: last step sample: %s", exc)
        if self._watcher is not None:
            self._watcher.stop()
        self._wakeups.stop()
        self.pools.release()
