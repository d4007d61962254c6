#!/usr/bin/env bash
# Idempotent installer for a fresh Debian 12 machine (root): apt packages, a virtualenv,
# the Python dependencies and a Horovod wheel built once and cached.
# Each step prints what it does and how long it took; a failing step says which one.
#   --keras3     also the Keras 3 environment (TensorFlow 2.21, no Horovod) that malleable_tf's
#                own tests run in a second time (make test)
#   --tf-matrix  also one environment per TensorFlow version of scripts/lib/tf-matrix.sh
#                (2.16 ... 2.20, Keras 3, no Horovod) at .venv-tf-<version>, made as the Keras 3
#                one is, for the subset of malleable_tf's tests run_tests.sh runs in each (make test)
#   --torch      also the PyTorch environment (.venv-torch: torch 2.13.0, the CPU build pip takes
#                from this machine kind's disk, ../shared/FACTS.md) that malleable_torch's tests
#                run in (make test)
set -euo pipefail
WITH_KERAS3=0
WITH_TF_MATRIX=0
WITH_TORCH=0
for arg in "$@"; do
  case "$arg" in
    --keras3) WITH_KERAS3=1 ;;
    --tf-matrix) WITH_TF_MATRIX=1 ;;
    --torch) WITH_TORCH=1 ;;
    *) echo "usage: setup.sh [--keras3] [--tf-matrix] [--torch]" >&2; exit 2 ;;
  esac
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/tf-matrix.sh
source "$REPO/scripts/lib/tf-matrix.sh"   # TF_MATRIX_VERSIONS
VENV="${MALLEABLE_VENV:-$REPO/.venv}"
CACHE="${MALLEABLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/malleable}"
WHEELS="$CACHE/wheels"

# lua5.1: the interpreter of the Lua slurmctld embeds (Debian's links liblua5.1), for the unit
# tests that run job_submit.lua. slurmdbd and MariaDB: the agents' cluster keeps accounting, where
# the watcher writes each job's borrowed cores (its daemons run on loopback, started by the tests).
# fuse3 and bindfs: a job user's own FUSE mount on his records folder (test_hostile).
APT_PACKAGES=(slurm-wlm slurmctld slurmd slurm-client munge libslurm-dev
              openmpi-bin libopenmpi-dev cmake g++ make procps iproute2 python3-venv python3-dev
              lua5.1 slurmdbd mariadb-server fuse3 bindfs rpm cpio gdb)
# The environment every cluster user's jobs run in: on Debian's own Python, in a folder every
# user can read (root's home, where a developer's Python may live, is not).
SITE_VENV="${MALLEABLE_SITE_VENV:-/opt/malleable/venv}"
SITE_PY="${MALLEABLE_SITE_PYTHON:-/usr/bin/python3}"
# The tests' and agents' environment is on the same Python: a job user's process started from it
# (a test's job of another user, a site that points its jobs at it) must be able to run it.
PY="${PYTHON:-$SITE_PY}"
TF_PIN="tensorflow-cpu==2.15.1"
HOROVOD_PIN="horovod==0.28.1"
KERAS3_VENV="${MALLEABLE_KERAS3_VENV:-$REPO/.venv-keras3}"
KERAS3_TF_PIN="tensorflow-cpu==2.21.0"

step_name=""
step_start=0
step() {
  step_name="$1"; step_start=$(date +%s.%N)
  printf '[setup] %s ...\n' "$step_name"
}
done_step() {
  local t; t=$(python3 -c "import sys; print(f'{float(sys.argv[2])-float(sys.argv[1]):.1f}')" "$step_start" "$(date +%s.%N)")
  printf '[setup] %s: done in %ss\n' "$step_name" "$t"
}
trap 'rc=$?; [ $rc -ne 0 ] && printf "[setup] FAILED at step: %s (exit %s)\n" "$step_name" "$rc" >&2' EXIT

step "apt packages (${APT_PACKAGES[*]})"
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "[setup] need root to apt-get install: ${missing[*]}" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "[setup] all apt packages present"
fi
# /dev/fuse as systemd's udev rules make it on Debian (0666: any user may mount a FUSE file
# system, fusermount3 checks the rest); a machine without udev leaves the kernel's 0600, and the
# hostile-user tests' FUSE mount (test_hostile.py) would not be the attack a real node allows.
if [ -c /dev/fuse ] && [ "$(stat -c %a /dev/fuse)" != 666 ] && [ "$(id -u)" = 0 ]; then
  chmod 0666 /dev/fuse && echo "[setup] /dev/fuse made 0666, as udev makes it"
fi
done_step

# A virtualenv on $PY at $1. One made on another interpreter (an earlier setup's, e.g. one in
# root's home that no other user can reach) is made again.
make_venv() {
  if [ -x "$1/bin/python" ] && ! grep -qx "home = $(dirname "$(readlink -f "$PY")")" \
       "$1/pyvenv.cfg" 2>/dev/null; then
    echo "[setup] $1 was made on another Python: making it again"
    rm -rf "$1"
  fi
  [ -x "$1/bin/python" ] || "$PY" -m venv "$1"
}

step "virtualenv at $VENV (on $PY)"
make_venv "$VENV"
done_step

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

# ruff and mypy: the linter and the type checker CI runs (pyproject.toml: [tool.ruff], [tool.mypy]).
PY_DEPS=("$TF_PIN" mpi4py psutil packaging cloudpickle pyyaml cffi wheel setuptools
         pytest pytest-timeout hypothesis matplotlib scikit-learn prometheus-client
         ruff==0.17.6 mypy==2.4.1)
# Installed distributions are checked by their metadata: importing TensorFlow takes ~10 s here.
have_versions() {
  "$VENV/bin/python" - "$@" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for spec in sys.argv[1:]:
    name, _, want = spec.partition("==")
    name = name.split(">")[0]
    try:
        got = version(name)
    except PackageNotFoundError:
        sys.exit(1)
    if want and got != want:
        sys.exit(1)
PYEOF
}

step "Python dependencies (${PY_DEPS[*]})"
if have_versions "${PY_DEPS[@]}"; then
  echo "[setup] already installed"
else
  "${PIP[@]}" install "${PY_DEPS[@]}"
fi
done_step

# The Horovod wheel, built once (against .venv's TensorFlow) and cached; prints its path.
horovod_wheel() {
  mkdir -p "$WHEELS"
  local whl
  whl=$(ls "$WHEELS"/horovod-0.28.1-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$whl" ]; then
    echo "[setup] building horovod from source (about 5 minutes on 2 cores; cached in $WHEELS)" >&2
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 MAKEFLAGS="-j$(nproc)" \
      "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$WHEELS" "$HOROVOD_PIN" >&2
    whl=$(ls "$WHEELS"/horovod-0.28.1-*.whl | head -n1)
  fi
  echo "$whl"
}

step "Horovod wheel ($HOROVOD_PIN against TensorFlow 2.15.1, Open MPI, Gloo)"
if have_versions "$HOROVOD_PIN"; then
  echo "[setup] horovod already installed"
else
  "${PIP[@]}" install --no-deps "$(horovod_wheel)"
  # A wheel built without MPI or Gloo would install fine and fail at the first job.
  "$VENV/bin/python" -c "import horovod.tensorflow as h; assert h.mpi_built() and h.gloo_built(), 'horovod lacks MPI or Gloo'"
fi
done_step

step "this project (editable install)"
installed_at=$("$VENV/bin/python" -I -c "import slurm_plugin, os; print(os.path.dirname(os.path.dirname(slurm_plugin.__file__)))" 2>/dev/null || true)
if [ "$installed_at" = "$REPO" ] && [ "$VENV/bin/malleable" -nt "$REPO/pyproject.toml" ]; then
  echo "[setup] already installed from $REPO"
else
  "${PIP[@]}" install --no-deps --no-build-isolation -e "$REPO"
fi
done_step

step "site environment for job users at $SITE_VENV (Debian's Python, world-readable)"
SITE_PIP=("$SITE_VENV/bin/python" -m pip --disable-pip-version-check -q)
SITE_DEPS=("$TF_PIN" mpi4py psutil packaging cloudpickle pyyaml cffi wheel setuptools
           scikit-learn prometheus-client)
[ -x "$SITE_VENV/bin/python" ] || "$SITE_PY" -m venv "$SITE_VENV"
if ! VENV="$SITE_VENV" have_versions "${SITE_DEPS[@]}" "$HOROVOD_PIN"; then
  "${SITE_PIP[@]}" install "${SITE_DEPS[@]}"
  "${SITE_PIP[@]}" install --no-deps "$(horovod_wheel)"
fi
# The project itself is copied in (not linked to this checkout, which users may not reach),
# again whenever its sources change; then the native library is built once for everyone.
digest=$(cd "$REPO" && git ls-files -z -- pyproject.toml malleable_protocol malleable_policy malleable_runtime malleable_tf examples \
           slurm_plugin sbatch_templates 2>/dev/null | xargs -0 sha256sum | sha256sum | cut -c1-16)
stamp="$SITE_VENV/.malleable-source"
if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ]; then
  "${SITE_PIP[@]}" install --no-deps --no-build-isolation --force-reinstall "$REPO"
  MALLEABLE_CACHE="$SITE_VENV/share/malleable" "$SITE_VENV/bin/python" -c \
    "import tensorflow as tf; from malleable_tf import _native; print('[setup] native library:', _native.build_for_this_tensorflow(tf))"
  echo "$digest" > "$stamp"
else
  echo "[setup] site environment up to date"
fi
chmod -R a+rX "$SITE_VENV"
chmod a+rx "$(dirname "$SITE_VENV")"
done_step

# An environment for a framework package's own tests, at $1 with $2 (a pin such as
# tensorflow-cpu==2.21.0 or torch==2.13.0): on $PY, with the test tools, and this project
# installed editable without its dependencies (no Horovod, no Slurm side's packages).
tf_test_env() {
  local venv="$1" tf_pin="$2" installed_at
  local deps=("$tf_pin" pytest pytest-timeout psutil prometheus-client numpy)
  make_venv "$venv"
  if VENV="$venv" have_versions "${deps[@]}"; then
    echo "[setup] already installed"
  else
    "$venv/bin/python" -m pip --disable-pip-version-check -q install "${deps[@]}"
  fi
  installed_at=$("$venv/bin/python" -I -c "import malleable_tf, os; print(os.path.dirname(os.path.dirname(malleable_tf.__file__)))" 2>/dev/null || true)
  # Again when pyproject.toml changed: a new console script (malleable-sbatch) appears only then.
  if [ "$installed_at" != "$REPO" ] || ! [ "$venv/bin/malleable" -nt "$REPO/pyproject.toml" ]; then
    "$venv/bin/python" -m pip --disable-pip-version-check -q install --no-deps \
      --no-build-isolation -e "$REPO"
  fi
}

if [ "$WITH_KERAS3" = 1 ]; then
  step "Keras 3 environment at $KERAS3_VENV ($KERAS3_TF_PIN, for malleable_tf's own tests)"
  tf_test_env "$KERAS3_VENV" "$KERAS3_TF_PIN"
  done_step
fi

if [ "$WITH_TF_MATRIX" = 1 ]; then
  for version in "${TF_MATRIX_VERSIONS[@]}"; do
    step "TensorFlow $version environment at $REPO/.venv-tf-$version (tensorflow-cpu==$version, for a subset of malleable_tf's tests)"
    tf_test_env "$REPO/.venv-tf-$version" "tensorflow-cpu==$version"
    done_step
  done
fi

# torch==2.13.0 exactly: the CPU build on this machine kind's disk. A range, or a newer release,
# makes pip download a CUDA build of several GB (the env entry of this machine kind).
TORCH_VENV="${MALLEABLE_TORCH_VENV:-$REPO/.venv-torch}"
TORCH_PIN="torch==2.13.0"
if [ "$WITH_TORCH" = 1 ]; then
  step "PyTorch environment at $TORCH_VENV ($TORCH_PIN, for malleable_torch's tests)"
  tf_test_env "$TORCH_VENV" "$TORCH_PIN"
  done_step
fi

echo "[setup] ready: $VENV (tests, agents) and $SITE_VENV (jobs of every user)"
