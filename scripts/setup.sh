#!/usr/bin/env bash
# Idempotent installer for a fresh Debian 12 machine (root): apt packages, a virtualenv,
# the Python dependencies and a Horovod wheel built once and cached.
# Each step prints what it does and how long it took; a failing step says which one.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MALLEABLE_VENV:-$REPO/.venv}"
CACHE="${MALLEABLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/malleable}"
WHEELS="$CACHE/wheels"
PY="${PYTHON:-python3}"

APT_PACKAGES=(slurm-wlm slurmctld slurmd slurm-client munge libslurm-dev
              openmpi-bin libopenmpi-dev cmake g++ make procps iproute2)
TF_PIN="tensorflow-cpu==2.15.1"
HOROVOD_PIN="horovod==0.28.1"

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
done_step

step "virtualenv at $VENV"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
done_step

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

step "Python dependencies ($TF_PIN and the build tools Horovod needs)"
if ! "$VENV/bin/python" -c "import tensorflow, mpi4py, psutil, pytest, cloudpickle, yaml" 2>/dev/null \
   || [ "$("$VENV/bin/python" -c 'import tensorflow as t; print(t.__version__)' 2>/dev/null)" != "2.15.1" ]; then
  "${PIP[@]}" install "$TF_PIN" mpi4py psutil packaging cloudpickle pyyaml cffi wheel setuptools \
      pytest pytest-timeout matplotlib scikit-learn
else
  echo "[setup] already installed"
fi
done_step

step "Horovod wheel ($HOROVOD_PIN against TensorFlow 2.15.1, Open MPI, Gloo)"
if "$VENV/bin/python" -c "import horovod.tensorflow as h; assert h.mpi_built() and h.gloo_built()" 2>/dev/null; then
  echo "[setup] horovod already installed"
else
  mkdir -p "$WHEELS"
  whl=$(ls "$WHEELS"/horovod-0.28.1-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$whl" ]; then
    echo "[setup] building horovod from source (about 6 minutes on 2 cores; cached in $WHEELS)"
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 MAKEFLAGS="-j$(nproc)" \
      "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$WHEELS" "$HOROVOD_PIN"
    whl=$(ls "$WHEELS"/horovod-0.28.1-*.whl | head -n1)
  fi
  "${PIP[@]}" install --no-deps "$whl"
  "$VENV/bin/python" -c "import horovod.tensorflow as h; assert h.mpi_built() and h.gloo_built()"
fi
done_step

step "this project (editable install)"
"${PIP[@]}" install --no-deps --no-build-isolation -e "$REPO"
done_step

echo "[setup] ready: $VENV"
