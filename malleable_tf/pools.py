"""TensorFlow's adapter to the runtime (``malleable_runtime.adapter``): its intra-op and
inter-op pools resized by parking threads through the native library, the kernels' split width
set to match, and the native library's signal fd and allowance poller as the wake-ups."""
from __future__ import annotations

import logging

from malleable_runtime.runtime import MalleableError

from ._native import INTER, INTRA, NativeLib
from .settings import Split

log = logging.getLogger(__name__)


class TfPools:
    def __init__(self, native: NativeLib, *, intra_pool: int, inter_pool: int,
                 split: Split = Split.ACTIVE, onednn_inline: bool = False):
        self.native = native
        self.intra_pool = intra_pool
        self.inter_pool = inter_pool
        self.split = split
        # At one active intra-op thread, oneDNN's work runs in the calling thread (split_width.cc)
        self.onednn_inline = onednn_inline
        self._warned_split = False

    @property
    def lib(self):
        """The native library's C functions (ctypes): counters for tests and benchmarks."""
        return self.native.lib

    @property
    def ops(self):
        """The native library's TensorFlow ops (the tf.data gate)."""
        return self.native.ops

    def resize(self, intra: int, inter: int, wait_s: float) -> None:
        self._set_parked(INTRA, self.intra_pool - intra)
        self._set_parked(INTER, self.inter_pool - inter)
        if self.split is not Split.POOL:
            self._set_split_width(intra)
        # tf.data map calls (malleable_tf.data) run on threads of their own: as many at once
        # as there are active inter-op threads, the pool that runs independent work.
        self.lib.mtf_gate_set_capacity(inter)
        if wait_s > 0:
            self.lib.mtf_wait_settled(INTRA, int(wait_s * 1000))
            self.lib.mtf_wait_settled(INTER, int(wait_s * 1000))

    def release(self) -> None:
        self.lib.mtf_shutdown()

    def _set_split_width(self, n: int) -> None:
        """New Eigen kernels split their work n ways, as in a process started with n threads."""
        rc = self.lib.mtf_set_split_width(n, int(self.split is Split.ACTIVE))
        if rc == 0 and self.onednn_inline:
            rc = self.lib.mtf_set_onednn_inline(int(n == 1))
        if rc == -2 and not self._warned_split:
            self._warned_split = True
            log.warning("malleable_tf: this TensorFlow's table of Eigen devices was not found; "
                        "kernels keep splitting work %d ways", self.intra_pool)
        elif rc not in (0, -2):
            raise MalleableError(f"native set_split_width({n}) failed with {rc}")

    def _set_parked(self, pool: int, n: int) -> None:
        rc = self.lib.mtf_set_parked(pool, n)
        if rc != 0:
            raise MalleableError(f"native set_parked(pool={pool}, n={n}) failed with {rc}")


class NativeWakeups:
    """The signal fd and the allowance poller of the same native library (signals.cc,
    poller.cc: they include no TensorFlow header)."""

    def __init__(self, native: NativeLib):
        self.native = native

    def install_signal(self, signo: int, action: int) -> int:
        return int(self.native.lib.mtf_install_signal(signo, action))

    def signal_fd(self) -> int:
        return int(self.native.lib.mtf_signal_fd())

    def poll_paths(self, paths: bytes) -> None:
        self.native.lib.mtf_poll_set_paths(paths, len(paths))

    def poll_start(self, interval_us: int, pid: int, action: int) -> int:
        return int(self.native.lib.mtf_poll_start(interval_us, pid, action))

    def stop(self) -> None:
        self.native.lib.mtf_poll_stop()
