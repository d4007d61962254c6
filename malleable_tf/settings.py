"""malleable_tf's settings: the runtime's (``malleable_runtime.settings``) and TensorFlow's own,
every environment variable parsed once, into ``Settings``.

``Settings.from_env(os.environ)`` gives each unset (or empty) variable its default and refuses a
bad value with one ValueError that names the variable and what it accepts. ``malleable_tf.init()``
takes its settings from it (its keyword arguments win), and so does ``malleable_tf.run``.

TensorFlow's own, beside the runtime's (listed in ``malleable_runtime.settings``):
- MALLEABLE_TF_SPLIT, MALLEABLE_TF_ONEDNN, MALLEABLE_TF_NATIVE, MALLEABLE_TF_STRATEGY: one of a
  few words each (the enums below).
- MALLEABLE_TF_CXXFLAGS: compiler flags for the native library's build.

Not here: CXX, MALLEABLE_CACHE and XDG_CACHE_HOME, which the native build reads where it runs
(the installer builds too).
"""
from __future__ import annotations

import enum
import shlex
from dataclasses import dataclass
from typing import Mapping

from malleable_runtime.settings import (AllowanceSource, Pinning, env_choice, core_fields,
                                        env_signals)
from malleable_runtime.settings import Settings as RuntimeSettings

__all__ = ["AllowanceSource", "NativeBuild", "NativeVariant", "OneDnn", "Pinning", "Settings",
           "Split", "Strategy", "env_signals"]


class Split(enum.Enum):
    """How many ways kernels split their work (MALLEABLE_TF_SPLIT)."""

    ACTIVE = "active"  # as many as active intra-op threads: Eigen kernels and Shard()
    EIGEN = "eigen"    # Eigen kernels only; Shard() splits by the pool size
    POOL = "pool"      # by the pool size, whatever is active (parking alone)


class Strategy(enum.Enum):
    """What ``malleable_tf.run`` starts before the script (MALLEABLE_TF_STRATEGY)."""

    # multiworker when the script names MultiWorkerMirroredStrategy (its source read, not run),
    # else none: an unmodified multi-worker script needs no setting.
    AUTO = "auto"
    NONE = "none"                  # malleable_tf.init() alone
    # malleable_tf.multiworker.init(): TF_CONFIG from the Slurm step and the strategy, which
    # must be made before TensorFlow's runtime starts (the script's mw.init() then returns it).
    MULTIWORKER = "multiworker"


class OneDnn(enum.Enum):
    """At one active intra-op thread, oneDNN's work runs in the calling thread (INLINE), as in a
    process started with one thread (MALLEABLE_TF_ONEDNN)."""

    INLINE = "inline"
    OFF = "off"


class NativeVariant(enum.Enum):
    """Which native library to build and load (MALLEABLE_TF_NATIVE)."""

    AUTO = "auto"                    # the full one where it builds, else parking only
    PARKING_ONLY = "parking-only"    # without the split width (see malleable_tf._native)


@dataclass(frozen=True)
class NativeBuild:
    """How the native library is built: apart, because a build outside init() (the installer's,
    scripts/setup.sh) reads these too."""

    variant: NativeVariant = NativeVariant.AUTO
    cxxflags: tuple[str, ...] = ()   # before TensorFlow's own: an -I here takes precedence

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> NativeBuild:
        flags = environ.get("MALLEABLE_TF_CXXFLAGS", "")
        try:
            cxxflags = tuple(shlex.split(flags))
        except ValueError as exc:    # an unclosed quote
            raise ValueError(f"MALLEABLE_TF_CXXFLAGS must be compiler flags as a shell splits "
                             f"them ({exc}), not {flags!r:.64}") from None
        return cls(env_choice(environ, "MALLEABLE_TF_NATIVE", NativeVariant.AUTO), cxxflags)


@dataclass(frozen=True)
class Settings(RuntimeSettings):
    """The runtime's settings and TensorFlow's; the defaults are what an empty environment says."""

    split: Split = Split.ACTIVE
    onednn: OneDnn = OneDnn.INLINE
    native: NativeBuild = NativeBuild()
    strategy: Strategy = Strategy.AUTO

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Every variable read once; a bad value raises ValueError naming the variable."""
        return cls(**core_fields(environ),
                   split=env_choice(environ, "MALLEABLE_TF_SPLIT", Split.ACTIVE),
                   onednn=env_choice(environ, "MALLEABLE_TF_ONEDNN", OneDnn.INLINE),
                   native=NativeBuild.from_env(environ),
                   strategy=env_choice(environ, "MALLEABLE_TF_STRATEGY", Strategy.AUTO))
