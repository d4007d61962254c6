#!/usr/bin/env bash
# Runs the whole test suite (unit and integration on the real local cluster) in .venv
# (TensorFlow 2.15, Keras 2, Horovod), then malleable_tf's own tests again in .venv-keras3
# (TensorFlow 2.21, Keras 3; Horovod does not support it, so tests marked horovod are left out).
# With arguments (a focused run: -k, a file) only the first suite runs, with them.
# pytest exits 5 when it collected no test: a failure here.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
KERAS3_TESTS=(tests/integration/test_malleable_tf.py tests/unit/test_allowance.py
              tests/unit/test_runtime_logic.py tests/unit/test_run.py
              tests/unit/test_package_edges.py tests/unit/test_step_windows.py
              tests/unit/test_horovod_guard.py)

check() {   # name, pytest's exit code
  if [ "$2" -eq 5 ]; then
    echo "[test] $1: pytest collected no tests: failing" >&2
    return 1
  fi
  return "$2"
}

.venv/bin/python -m pytest -v -rs --durations=15 --ignore=tests/docker --ignore=tests/vm "$@" tests
check "TensorFlow 2.15 suite" $?; rc=$?
[ $# -gt 0 ] && exit $rc
start=$(date +%s)
.venv-keras3/bin/python -m pytest -v -rs --durations=5 -m "not horovod" "${KERAS3_TESTS[@]}"
check "Keras 3 suite" $?; rc3=$?
echo "[test] Keras 3 suite (TensorFlow $(.venv-keras3/bin/python -c 'from importlib.metadata import version; print(version("tensorflow-cpu"))')): exit $rc3 in $(( $(date +%s) - start )) s"
[ $rc -ne 0 ] && exit $rc
exit $rc3
