"""Build (once, cached) and load the native part: the thread-parking op and signal plumbing.

Every .cc file in native/ is compiled into one shared library against the installed TensorFlow's
headers on first use, cached per TensorFlow version, sources (.cc and .h) and compiler flags, so
no manual build step exists. Several ranks starting at once on one node build it once: the build
holds a file lock. Where it is looked for, in order: the environment's site copy (``python -m
malleable_tf.build``), the copies the wheel carries (``native/prebuilt``, built by
packaging/build-wheels.sh for the TensorFlow releases it was given), then the user's cache. A
library's name says the TensorFlow version and a digest of the sources and of TensorFlow's flags
with their paths left out (the headers' and the library's folder differ from one environment to
the next; the ABI flags and TensorFlow's version do not), so a copy built in another
environment with the same TensorFlow is found. MALLEABLE_TF_PREBUILT=0 ignores the wheel's.

One part reads a private member of TensorFlow (split_width.cc). Against a TensorFlow whose
headers differ there, the full build fails; ``load`` then builds the parking-only variant, warns
once, and remembers the failure next to the cache (no process pays for the failed build again).
MALLEABLE_TF_NATIVE=parking-only asks for that variant directly; MALLEABLE_TF_CXXFLAGS adds
compiler flags (placed before TensorFlow's own, so an -I there takes precedence).
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .settings import NativeBuild, NativeVariant

NATIVE_DIR = Path(__file__).parent / "native"
PREBUILT_DIR = NATIVE_DIR / "prebuilt"

INTRA = 0
INTER = 1


class NativeBuildError(RuntimeError):
    pass


class CompilerRefused(NativeBuildError):
    """The compiler ran and rejected the sources against this TensorFlow's headers, now or in an
    earlier build (``note``: where that is remembered)."""

    def __init__(self, message: str, note: Path, earlier: bool):
        super().__init__(message)
        self.note = note
        self.earlier = earlier


def cache_dir() -> Path:
    base = os.environ.get("MALLEABLE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "malleable")
    return Path(base) / "native"


def site_cache_dir() -> Path:
    """Read-only copies built by the installer for every user of this environment (job users
    may have no home to build in): <environment>/share/malleable/native."""
    return Path(sys.prefix) / "share" / "malleable" / "native"


def sources() -> list[Path]:
    """The .cc files that make up the library, sorted."""
    found = sorted(NATIVE_DIR.glob("*.cc"))
    if not found:
        raise NativeBuildError(
            f"malleable_tf's native sources are missing: no .cc file in {NATIVE_DIR} (was the "
            f"package installed without its package data native/*.cc and native/*.h?)")
    return found


def _digest_inputs() -> list[Path]:
    """Every source and header, sorted: a change to any of them means a new build."""
    return sorted([*sources(), *NATIVE_DIR.glob("*.h")])


PARKING_ONLY_DEFINE = "-DMTF_PARKING_ONLY"


def _flags(tf, parking_only: bool = False, cxxflags: Sequence[str] = ()) -> list[str]:
    return [*cxxflags, *([PARKING_ONLY_DEFINE] if parking_only else []),
            *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]


def _without_paths(flags: Sequence[str]) -> list[str]:
    """The flags with the folders of -I and -L left out: where TensorFlow is installed does not
    change the library built against it."""
    return [flag[:2] if flag.startswith(("-I", "-L")) else flag for flag in flags]


def library_name(tf, parking_only: bool = False, cxxflags: Sequence[str] = ()) -> str:
    h = hashlib.sha256()
    for path in _digest_inputs():
        data = path.read_bytes()
        h.update(f"{path.name}\0{len(data)}\0".encode())
        h.update(data)
    h.update("\0".join(_without_paths(_flags(tf, parking_only, cxxflags))).encode())
    digest = h.hexdigest()[:16]
    variant = "-parking-only" if parking_only else ""
    return f"libmalleable_tf-{tf.__version__}{variant}-{digest}.so"


def prebuilt_dirs() -> list[Path]:
    """The copies the wheel carries, unless MALLEABLE_TF_PREBUILT=0."""
    return [] if os.environ.get("MALLEABLE_TF_PREBUILT", "1") == "0" else [PREBUILT_DIR]


def library_path(tf, parking_only: bool = False, cxxflags: Sequence[str] = ()) -> Path:
    """Where this TensorFlow's library is, or will be built: the site's copy when the
    installer made one, else the wheel's, else the user's cache."""
    name = library_name(tf, parking_only, cxxflags)
    for folder in (site_cache_dir(), *prebuilt_dirs()):
        # A build refused there (its note): the fallback is that folder's too, not a
        # compiler a compute node may not have.
        if (folder / name).exists() or _failure_note(folder / name).exists():
            return folder / name
    return cache_dir() / name


def _failure_note(target: Path) -> Path:
    return target.with_name(target.name + ".failed")


def build(tf, *, compiler: str | None = None, parking_only: bool = False,
          cxxflags: Sequence[str] = (), into: Path | None = None) -> Path:
    """Compile the library if the cache has no copy for this TensorFlow; return its path.
    A build that failed before (its note is in the cache) fails again at once. ``into``: that
    folder instead of the cache (the site's copy, ``python -m malleable_tf.build``)."""
    target = into / library_name(tf, parking_only, cxxflags) if into is not None else \
        library_path(tf, parking_only, cxxflags)
    if target.exists():
        return target
    note = _failure_note(target)
    if note.exists():
        raise CompilerRefused(note.read_text(errors="replace")[-2000:], note, earlier=True)
    cxx = compiler or os.environ.get("CXX") or "g++"
    if shutil.which(cxx) is None:
        raise NativeBuildError(
            f"malleable_tf needs its thread-parking library for TensorFlow {tf.__version__}, "
            f"and no build of it is in "
            f"{', '.join(str(d) for d in (site_cache_dir(), *prebuilt_dirs()))} or "
            f"{cache_dir()}; building one needs a "
            f"C++ compiler, and '{cxx}' is not on PATH: run `{sys.executable} -m "
            f"malleable_tf.build` once where there is one (a login node), or install g++ (or "
            f"set CXX)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # A job user without a home: build in a private folder, for this process only.
        private = Path(tempfile.mkdtemp(prefix="malleable-native-"))
        logging.getLogger(__name__).warning(
            "malleable_tf: cannot use the cache %s (%s); building in %s for this process "
            "(set MALLEABLE_CACHE, or let the installer build the site copy)",
            target.parent, exc, private)
        target = private / target.name
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another process built it while we waited
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out = Path(tmp) / target.name
            from malleable_protocol.runner import CommandError, run_command
            try:
                run_command([cxx, "-std=c++17", "-shared", "-fPIC", "-O2",
                             *(str(src) for src in sources()), "-o", str(out),
                             *_flags(tf, parking_only, cxxflags)], timeout=600)
            except CommandError as exc:
                if exc.returncode is not None and exc.returncode > 0:   # the compiler said no
                    # Its errors, not the last lines: newer headers add pages of warnings.
                    errors = [line for line in exc.stderr.splitlines() if " error: " in line]
                    message = (f"building the thread-parking library failed ({cxx} exit "
                               f"{exc.returncode}): " + " | ".join(errors[:5] or [str(exc)]))
                    note.write_text(message)
                    raise CompilerRefused(message, note, earlier=False) from exc
                raise NativeBuildError(f"building the thread-parking library failed: {exc}") from exc
            os.replace(out, target)
    return target


@dataclass
class NativeLib:
    path: Path
    ops: object          # the module tf.load_op_library returns
    lib: ctypes.CDLL     # the same shared object, for its extern "C" functions
    parking_only: bool = False   # built without the split width (see the module's doc)

    def attach(self, inter_op_threads: int) -> int:
        return int(self.ops.malleable_attach(inter_op_threads=inter_op_threads).numpy())


def build_for_this_tensorflow(tf, native: NativeBuild | None = None, *,
                              into: Path | None = None) -> tuple[Path, bool]:
    """The library to load, and whether it is the parking-only variant: the full one where it
    builds against this TensorFlow, else parking only, with a warning. ``native``: how to
    build (default: MALLEABLE_TF_NATIVE and MALLEABLE_TF_CXXFLAGS); ``into``: see ``build``."""
    native = native or NativeBuild.from_env(os.environ)
    if native.variant is NativeVariant.PARKING_ONLY:
        return build(tf, parking_only=True, cxxflags=native.cxxflags, into=into), True
    try:
        return build(tf, cxxflags=native.cxxflags, into=into), False
    except CompilerRefused as full:
        try:
            path = build(tf, parking_only=True, cxxflags=native.cxxflags, into=into)
        except NativeBuildError as fallback:
            raise NativeBuildError(f"{full}\nand the parking-only variant: {fallback}") from full
        logging.getLogger(__name__).warning(
            "malleable_tf: the full native library does not build against TensorFlow %s (its "
            "split-width part reads a private member of DeviceBase); using parking only: "
            "threads are parked and woken, kernels keep splitting work by the pool size. "
            "The compiler said (%s): %s", tf.__version__,
            f"in an earlier build; delete {full.note} to try again" if full.earlier else "now",
            str(full)[-600:])
        return path, True


def load(tf, native: NativeBuild | None = None) -> NativeLib:
    path, parking_only = build_for_this_tensorflow(tf, native)
    ops = tf.load_op_library(str(path))
    lib = ctypes.CDLL(str(path))
    for name, argtypes in {
        "mtf_attached": [], "mtf_pool_size": [ctypes.c_int], "mtf_parked": [ctypes.c_int],
        "mtf_target": [ctypes.c_int], "mtf_set_parked": [ctypes.c_int, ctypes.c_int],
        "mtf_wait_settled": [ctypes.c_int, ctypes.c_int], "mtf_signal_fd": [],
        "mtf_install_signal": [ctypes.c_int, ctypes.c_int], "mtf_uninstall_signal": [ctypes.c_int],
        "mtf_parked_tids": [ctypes.c_int, ctypes.POINTER(ctypes.c_long), ctypes.c_int],
        "mtf_poll_set_paths": [ctypes.c_char_p, ctypes.c_int],
        "mtf_poll_start": [ctypes.c_int, ctypes.c_int, ctypes.c_int],
        "mtf_gate_set_capacity": [ctypes.c_int], "mtf_set_split_width": [ctypes.c_int, ctypes.c_int],
        "mtf_split_width": [], "mtf_set_onednn_inline": [ctypes.c_int],
    }.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    for name in ("mtf_shutdown", "mtf_poll_stop", "mtf_gate_reset_max"):
        getattr(lib, name).argtypes = []
        getattr(lib, name).restype = None
    for name in ("mtf_poll_count", "mtf_gate_stat"):
        getattr(lib, name).argtypes = [ctypes.c_int]
        getattr(lib, name).restype = ctypes.c_long
    return NativeLib(path=path, ops=ops, lib=lib, parking_only=parking_only)
