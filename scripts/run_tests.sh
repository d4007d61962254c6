#!/usr/bin/env bash
# Runs the whole test suite (unit and integration on the real local cluster) in .venv
# (TensorFlow 2.15, Keras 2, Horovod), then ruff and mypy (pyproject.toml), then malleable_tf's
# own tests again in .venv-keras3
# (TensorFlow 2.21, Keras 3; Horovod does not support it, so tests marked horovod are left out),
# then malleable_torch's in .venv-torch (torch 2.13.0: `scripts/setup.sh --torch`), then a
# subset of malleable_tf's in each .venv-tf-<version> (the versions between: scripts/lib/tf-matrix.sh,
# made by `scripts/setup.sh --tf-matrix`). A failure on any version fails the run.
# With arguments (a focused run: -k, a file) only the first suite runs, with them; with
# --tf-matrix alone, only the subset on each version between.
# pytest exits 5 when it collected no test: a failure here.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
# shellcheck source=lib/tf-matrix.sh
source scripts/lib/tf-matrix.sh   # TF_MATRIX_VERSIONS
KERAS3_TESTS=(tests/integration/test_malleable_tf.py tests/unit/runtime/test_allowance.py
              tests/unit/runtime/test_runtime_logic.py tests/unit/tf/test_run.py
              tests/unit/test_package_edges.py tests/unit/runtime/test_step_windows.py
              tests/unit/tf/test_horovod_guard.py)
# malleable_torch on PyTorch (.venv-torch, `scripts/setup.sh --torch`): its tests on real PyTorch,
# and the runtime's and the adapter's unit tests again beside that PyTorch.
TORCH_TESTS=(tests/torch tests/unit/torch tests/unit/runtime tests/unit/test_package_edges.py)
# On each version between: the native library built against that TensorFlow's headers (the full
# variant: the split width reads a private member) and loaded, its parked threads at exit;
# resizes (API, signals, 1,000 during training: same losses); following taskset and a cpuset
# cgroup (the native poller); telemetry (the status record through the runner, steps and steps/s
# counted through Keras 3's optimizers and MalleableCallback). About 60 s a version here, plus
# about 30 s the first time for the library's build (cached per version in ~/.cache/malleable).
MTF=tests/integration/test_malleable_tf.py
TF_MATRIX_TESTS=("$MTF::test_onednn_inline_gives_the_same_results_at_every_width[inline]"
                 "$MTF::test_bad_input_before_and_after_init"
                 "$MTF::test_init_after_first_op_is_a_clear_error"
                 "$MTF::test_exit_with_threads_parked_does_not_hang[normal-0]"
                 "$MTF::test_storm_of_resizes_and_signals_during_training"
                 "$MTF::test_follows_taskset_from_outside"
                 "$MTF::test_follows_cpuset_cgroup_changes"
                 "$MTF::test_an_unmodified_script_runs_malleably_through_the_runner"
                 "$MTF::test_custom_loops_count_their_steps"
                 "$MTF::test_keras_fit_with_the_callback_counts_each_batch_once[1]")

check() {   # name, pytest's exit code
  if [ "$2" -eq 5 ]; then
    echo "[test] $1: pytest collected no tests: failing" >&2
    return 1
  fi
  return "$2"
}

tf_matrix() {   # the subset on each version between; 1 if any failed
  local version venv got start r failed=0
  for version in "${TF_MATRIX_VERSIONS[@]}"; do
    venv=".venv-tf-$version"
    start=$(date +%s)
    got=$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("tensorflow-cpu"))' 2>/dev/null)
    if [ "$got" != "$version" ]; then
      echo "[test] TensorFlow $version: $venv has ${got:-no tensorflow-cpu} (run scripts/setup.sh --tf-matrix)" >&2
      r=1
    else
      "$venv/bin/python" -m pytest -v -rs --durations=5 -m "not horovod" "${TF_MATRIX_TESTS[@]}"
      check "TensorFlow $version subset" $?; r=$?
    fi
    echo "[test] TensorFlow $version subset: exit $r in $(( $(date +%s) - start )) s"
    [ $r -ne 0 ] && failed=1
  done
  return $failed
}

if [ "$*" = "--tf-matrix" ]; then
  tf_matrix
  exit $?
fi

.venv/bin/python -m pytest -v -rs --durations=15 --ignore=tests/docker --ignore=tests/vm \
  --ignore=tests/torch "$@" tests
check "TensorFlow 2.15 suite" $?; rc=$?
[ $# -gt 0 ] && exit $rc
# The linter on everything, the type checker (strict) on the pure packages: pyproject.toml.
start=$(date +%s)
.venv/bin/ruff check . && .venv/bin/mypy; rcl=$?
echo "[test] ruff and mypy: exit $rcl in $(( $(date +%s) - start )) s"
start=$(date +%s)
.venv-keras3/bin/python -m pytest -v -rs --durations=5 -m "not horovod" "${KERAS3_TESTS[@]}"
check "Keras 3 suite" $?; rc3=$?
echo "[test] Keras 3 suite (TensorFlow $(.venv-keras3/bin/python -c 'from importlib.metadata import version; print(version("tensorflow-cpu"))')): exit $rc3 in $(( $(date +%s) - start )) s"
start=$(date +%s)
.venv-torch/bin/python -m pytest -v -rs --durations=5 "${TORCH_TESTS[@]}"
check "PyTorch suite" $?; rct=$?
echo "[test] PyTorch suite (torch $(.venv-torch/bin/python -c 'from importlib.metadata import version; print(version("torch"))')): exit $rct in $(( $(date +%s) - start )) s"
tf_matrix; rcm=$?
[ $rc -ne 0 ] && exit $rc
[ $rcl -ne 0 ] && exit $rcl
[ $rc3 -ne 0 ] && exit $rc3
[ $rct -ne 0 ] && exit $rct
exit $rcm
