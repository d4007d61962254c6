"""The live resizing runtime of one TensorFlow process.

``Runtime`` owns the target thread counts and applies them: it parks pool threads through the
native library, pins the process's threads to this rank's share of the allowed CPUs, and, when
following, re-reads the allowance whenever the native poller sees the affinity mask or a cgroup
file change, on every control signal, and once a second as a safety net. Nothing starts in the
constructor: ``start_watcher`` starts the Python watcher thread and the native poller.
"""
from __future__ import annotations

import enum
import logging
import os
import select
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from malleable_protocol import ProtocolError, RankStatus, ResizeEvent, Target, format_cpu_list
from malleable_protocol.records import MAX_RECORD_BYTES
from malleable_protocol.safe_io import read_bounded

from . import allowance as allow
from . import telemetry
from ._native import INTER, INTRA, NativeLib

log = logging.getLogger("malleable_tf")


class MalleableError(RuntimeError):
    pass


class NotInitialized(MalleableError):
    def __init__(self) -> None:
        super().__init__("malleable_tf.init() has not run (or shutdown() has)")


class Action(enum.Enum):
    """What a control signal asks for."""

    RELOAD = 1       # re-read the allowance and the target file
    INTRA_UP = 2
    INTRA_DOWN = 3
    INTER_UP = 4
    INTER_DOWN = 5
    ALLOWANCE = 6    # re-read the allowance only (what the native poller sends on a change)


class Split(enum.Enum):
    """How many ways kernels split their work (MALLEABLE_TF_SPLIT)."""

    ACTIVE = "active"  # as many as active intra-op threads: Eigen kernels and Shard()
    EIGEN = "eigen"    # Eigen kernels only; Shard() splits by the pool size
    POOL = "pool"      # by the pool size, whatever is active (parking alone)


DEFAULT_SIGNALS: dict[int, Action] = {signal.SIGUSR1: Action.RELOAD}


def parse_signal_spec(text: str) -> dict[int, Action]:
    """ "USR1=reload,USR2=intra-down" -> {SIGUSR1: RELOAD, SIGUSR2: INTRA_DOWN}."""
    out: dict[int, Action] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, action = item.partition("=")
        if not sep:
            raise ValueError(f"bad signal mapping {item!r}: want NAME=action")
        name = name.strip().upper()
        try:
            signo = signal.Signals[name if name.startswith("SIG") else "SIG" + name]
            act = Action[action.strip().upper().replace("-", "_")]
        except KeyError as exc:
            raise ValueError(f"bad signal mapping {item!r}") from exc
        if signo in (signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGBUS):
            raise ValueError(f"{signo.name} cannot be a control signal")
        out[int(signo)] = act
    return out


@dataclass(frozen=True)
class ThreadState:
    intra_active: int
    intra_pool: int
    inter_active: int
    inter_pool: int
    allowed_cpus: frozenset[int]
    share_cpus: frozenset[int]
    following: bool


def thread_ids(pid: int | str = "self") -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [threading.get_native_id()] if pid == "self" else []


def pin_all_threads(cpus: frozenset[int], pid: int | str = "self") -> None:
    """Set the affinity of every thread of a process, this one by default (what
    ``taskset -a -p`` does; threads created later inherit their creator's mask)."""
    for tid in thread_ids(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError, OSError):
            pass  # a thread that just exited


class Runtime:
    def __init__(self, native: NativeLib, *, intra_pool: int, inter_pool: int, local_rank: int,
                 local_size: int, rank: int = 0, follow: bool = True, poll_interval_s: float = 0.005,
                 recheck_interval_s: float = 1.0,
                 status_path: Path | None = None, target_path: Path | None = None,
                 read_affinity: Callable[[], frozenset[int]] = lambda: allow.read_affinity(os.getpid()),
                 cgroup: allow.CgroupReader | None = None, mask_restricts: bool = True,
                 split: Split = Split.ACTIVE,
                 pin: Callable[[frozenset[int]], None] = pin_all_threads,
                 clock: Callable[[], float] = time.monotonic):
        self._native = native
        self.intra_pool = intra_pool
        self.inter_pool = inter_pool
        self.local_rank, self.local_size, self.rank = local_rank, local_size, rank
        self.follow = follow
        # The native poll (a few syscalls, no GIL) runs every poll_interval_s; the Python
        # watcher re-reads everything itself every recheck_interval_s (and finds cgroup moves).
        self.poll_interval_s = poll_interval_s
        self.recheck_interval_s = recheck_interval_s
        self._polled_paths: tuple[Path, ...] | None = None
        self.status_path = status_path
        self.target_path = target_path
        self._read_affinity = read_affinity
        self._cgroup = cgroup or allow.CgroupReader()
        # Under Slurm with the co-scheduler the step's cpuset is the allowance, and the mask
        # slurmstepd binds a task to at launch is not a limit (it does not widen when the cpuset
        # grows): MALLEABLE_TF_ALLOWANCE=cgroup turns mask restrictions off.
        self.mask_restricts = mask_restricts
        self.split = split
        self._pinned: frozenset[int] | None = None
        self._pin = pin
        self._clock = clock
        self._lock = threading.RLock()
        self._closed = False
        # What was asked (API, signals, target file); the effective count is capped by the share.
        self._want_intra = intra_pool
        self._want_inter = inter_pool
        self._intra = intra_pool
        self._inter = inter_pool
        # An affinity restriction set from outside (taskset), narrower than the cpuset.
        self._outside_mask: frozenset[int] | None = None
        self._allowance = self._read_allowance()
        self._share = self._allowance.cpus
        self._rate = telemetry.StepRate()
        self._resizes = 0
        self._last: ResizeEvent | None = None
        # The co-scheduler's Target for this job on this node: the cores the job holds there,
        # or is about to hold (a shrink parks threads before the cpuset narrows).
        self._target: Target | None = None
        self._steps = 0
        self._watcher: threading.Thread | None = None
        self._stop_r, self._stop_w = os.pipe()
        self._warned_split = False

    # --- state ---------------------------------------------------------------------------

    @property
    def native_lib(self):
        """The native library's C functions (ctypes): counters for tests and benchmarks."""
        return self._native.lib

    @property
    def native_ops(self):
        """The native library's TensorFlow ops (the tf.data gate)."""
        return self._native.ops

    def state(self) -> ThreadState:
        with self._lock:
            return ThreadState(self._intra, self.intra_pool, self._inter, self.inter_pool,
                               self._allowance.cpus, self._share, self.follow)

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
            new = self._read_allowance()
            if new == self._allowance:
                return False
            self._allowance = new
            self._apply(reason, wait_s)
            return True

    def _read_allowance(self) -> allow.Allowance:
        """The cpuset cgroup is the allowance where it can be read; an affinity mask narrower
        than it counts only when someone outside set it (taskset), not when it is our own
        pinning or what the kernel left of it after a cpuset change (pinned & cpuset on kernels
        >= 6.2, the whole cpuset on older ones)."""
        mask = self._read_affinity()
        cpuset = self._cgroup.cpuset()

        def explained() -> set:
            out = set()
            if self._pinned is not None:
                out.add(self._pinned)
                if cpuset:
                    out.add(self._pinned & cpuset)
            return out

        if mask not in explained():
            # Before taking it for a taskset, make sure the cpuset is read from where the
            # process is now: a move to another cgroup also rewrites the mask.
            self._cgroup.invalidate()
            cpuset = self._cgroup.cpuset()
        if mask not in explained():
            restricts = self.mask_restricts or not cpuset
            self._outside_mask = None if (cpuset and mask >= cpuset) or not restricts else mask
        if cpuset:
            cpus = (cpuset & self._outside_mask) if self._outside_mask else cpuset
            cpus = cpus or cpuset
        else:
            cpus = self._outside_mask or mask
        return allow.Allowance(cpus=frozenset(cpus), quota_cpus=self._cgroup.quota())

    def _effective_allowance(self) -> allow.Allowance:
        """The allowance capped by the agent's target (a target disjoint from it is stale)."""
        if self._target is None:
            return self._allowance
        capped = self._allowance.cpus & self._target.cpus
        if not capped:
            return self._allowance
        return allow.Allowance(cpus=capped, quota_cpus=self._allowance.quota_cpus)

    def _apply(self, reason: str, wait_s: float) -> None:
        t0 = self._clock()
        if self.follow:
            share = allow.share_of(self._effective_allowance(), self.local_rank, self.local_size)
        else:
            share = self._share
        cap = len(share) if self.follow else max(self.intra_pool, self.inter_pool)
        intra = max(1, min(self._want_intra, cap, self.intra_pool))
        inter = max(1, min(self._want_inter, cap, self.inter_pool))
        before = (self._intra, self._inter)
        grow = len(share) >= len(self._share)
        # Growing: widen the CPU set first, then wake threads. Shrinking: park first, then
        # narrow, so the process never has more running threads than cores.
        if self.follow and grow and share != self._pinned:
            self._pin(share)
            self._pinned = share
        self._set_parked(INTRA, self.intra_pool - intra)
        self._set_parked(INTER, self.inter_pool - inter)
        if self.split is not Split.POOL:
            self._set_split_width(intra)
        # tf.data map calls (malleable_tf.data) run on threads of their own: as many at once
        # as there are active inter-op threads, the pool that runs independent work.
        self._native.lib.mtf_gate_set_capacity(inter)
        if wait_s > 0:
            self._native.lib.mtf_wait_settled(INTRA, int(wait_s * 1000))
            self._native.lib.mtf_wait_settled(INTER, int(wait_s * 1000))
        if self.follow and not grow and share != self._pinned:
            self._pin(share)
            self._pinned = share
        self._share = share
        self._intra, self._inter = intra, inter
        latency_ms = (self._clock() - t0) * 1000
        if before != (intra, inter):
            self._resizes += 1
            self._last = ResizeEvent(time.time(), before[0], intra, before[1], inter,
                                               reason, round(latency_ms, 3))
            log.info("malleable_tf: rank %d resize intra %d->%d inter %d->%d cpus=%s reason=%s "
                     "latency=%.2fms", self.rank, before[0], intra, before[1], inter,
                     format_cpu_list(share), reason, latency_ms)
        self.write_status()

    def _set_split_width(self, n: int) -> None:
        """New Eigen kernels split their work n ways, as in a process started with n threads."""
        rc = self._native.lib.mtf_set_split_width(n, int(self.split is Split.ACTIVE))
        if rc == -2 and not self._warned_split:
            self._warned_split = True
            log.warning("malleable_tf: this TensorFlow's table of Eigen devices was not found; "
                        "kernels keep splitting work %d ways", self.intra_pool)
        elif rc not in (0, -2):
            raise MalleableError(f"native set_split_width({n}) failed with {rc}")

    def _set_parked(self, pool: int, n: int) -> None:
        rc = self._native.lib.mtf_set_parked(pool, n)
        if rc != 0:
            raise MalleableError(f"native set_parked(pool={pool}, n={n}) failed with {rc}")

    # --- steps/s and telemetry -------------------------------------------------------------

    def record_steps(self, steps: int, seconds: float, threads: int | None = None) -> None:
        """Credit ``steps`` done in ``seconds`` to ``threads`` intra-op threads (default: now)."""
        with self._lock:
            self._rate.record(self._intra if threads is None else threads, steps, seconds)
            self._steps += max(0, steps)

    def status_record(self) -> RankStatus:
        with self._lock:
            return RankStatus(
                pid=os.getpid(), node=os.environ.get("SLURMD_NODENAME", "")[:64], rank=self.rank,
                local_rank=self.local_rank, local_size=self.local_size,
                intra_active=self._intra, intra_pool=self.intra_pool,
                inter_active=self._inter, inter_pool=self.inter_pool,
                allowed_cpus=self._allowance.cpus, share_cpus=self._share,
                steps_per_s=dict(self._rate.rates), steps=self._steps,
                resizes=self._resizes, last_resize=self._last, updated=time.time())

    def write_status(self) -> None:
        if self.status_path is None:
            return
        try:
            telemetry.write_status(self.status_path, self.status_record())
        except OSError as exc:
            log.warning("malleable_tf: cannot write status to %s: %s", self.status_path, exc)

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
        """Read the co-scheduler's Target (bounded, no links followed). A bad or missing file is
        reported (bad) and changes nothing."""
        if self.target_path is None:
            return
        try:
            self._target = Target.decode(read_bounded(self.target_path, MAX_RECORD_BYTES))
        except FileNotFoundError:
            return
        except (OSError, ProtocolError) as exc:
            log.warning("malleable_tf: ignoring target file %s: %s", self.target_path, exc)

    def install_signals(self, mapping: dict[int, Action]) -> None:
        for signo, action in mapping.items():
            rc = self._native.lib.mtf_install_signal(int(signo), action.value)
            if rc != 0:
                raise MalleableError(f"cannot install handler for signal {signo}: {-rc}")

    def start_watcher(self) -> None:
        if self._watcher is not None:
            return
        if self.follow:
            self._arm_poller()
            rc = self._native.lib.mtf_poll_start(int(self.poll_interval_s * 1e6), os.getpid(),
                                                 Action.ALLOWANCE.value)
            if rc != 0:
                raise MalleableError(f"cannot start the allowance poller: {-rc}")
        self._watcher = threading.Thread(target=self._watch, name="malleable-watcher",
                                         daemon=True)
        self._watcher.start()

    def _arm_poller(self) -> None:
        """Point the native poller at this process's cgroup files (again, after a move)."""
        paths = tuple(self._cgroup.watched_paths())
        if paths != self._polled_paths:
            joined = b"\0".join(os.fsencode(p) for p in paths)
            self._native.lib.mtf_poll_set_paths(joined, len(joined))
            self._polled_paths = paths

    def _watch(self) -> None:
        sig_fd = self._native.lib.mtf_signal_fd()
        while True:
            ready, _, _ = select.select([sig_fd, self._stop_r], [], [], self.recheck_interval_s)
            if self._stop_r in ready:
                return
            try:
                if sig_fd in ready:
                    for code in _drain(sig_fd):
                        try:
                            self.handle(Action(code))
                        except ValueError:
                            continue
                if not ready:   # the once-a-second safety net: a missed signal, a moved cgroup
                    self.handle(Action.RELOAD)
                else:
                    self.refresh_allowance()
                if self.follow:
                    self._arm_poller()
            except Exception as exc:  # the watcher must outlive any one bad event
                log.warning("malleable_tf: watcher: %s", exc)

    def close(self) -> None:
        """Release every parked thread for good and stop the watcher. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        os.write(self._stop_w, b"x")
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=5)
        self._native.lib.mtf_shutdown()


def _drain(fd: int) -> bytes:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk

