"""``python -m malleable_tf.build``: the native library built now, for the TensorFlow of this
environment, so that no job compiles it (compute nodes often have no compiler).

Run it once after ``pip install``, with the environment's own python, where there is a C++
compiler (a login node): by default into the environment's site copy
(``<environment>/share/malleable/native``, read by every user of the environment, on every node
that mounts it), or with ``--user`` into the user's cache (``~/.cache/malleable``, or
``MALLEABLE_CACHE``). The same choice as ``init()``: the full library, or parking only where the
full one does not build against this TensorFlow (MALLEABLE_TF_NATIVE and MALLEABLE_TF_CXXFLAGS
apply). A new TensorFlow or a new version of this package needs a new build: ``init()`` says so
when a job finds none and no compiler.

Exit codes: 0 built (or already there), 1 it could not be, 2 a wrong command line."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from malleable_tf import _native


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m malleable_tf.build",
                                     description="Build malleable_tf's native library for this "
                                                 "environment's TensorFlow.")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true",
                       help="into the user's cache, not the environment's site copy")
    where.add_argument("--into", type=Path, help="into this folder (a site's own layout)")
    args = parser.parse_args(argv)
    into = None if args.user else (args.into or _native.site_cache_dir())
    t0 = time.monotonic()
    if into is not None:
        try:
            into.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"malleable_tf.build: cannot write {into} ({exc}): run it as the "
                  f"environment's owner, or with --user", file=sys.stderr)
            return 1
    try:
        import tensorflow as tf
        path, parking_only = _native.build_for_this_tensorflow(tf, into=into)
    except (ImportError, _native.NativeBuildError, OSError, ValueError) as exc:
        print(f"malleable_tf.build: {exc}", file=sys.stderr)
        return 1
    variant = "parking only" if parking_only else "full"
    print(f"malleable_tf: native library for TensorFlow {tf.__version__} ({variant}): {path} "
          f"({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
