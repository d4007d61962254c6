#!/usr/bin/env bash
# The test suite in its parts, each in its own environment:
#   main       every test in .venv (TensorFlow 2.15, Keras 2, Horovod) but docker's, the VMs' and
#              PyTorch's, in one pytest run; it is these three:
#     cluster  the tests that start real local Slurm clusters (tests/integration, tests/site: Slurm
#              built as sites build it) but test_malleable_tf.py
#     tf215    test_malleable_tf.py: TensorFlow 2.15's processes, no Slurm
#     unit     tests/unit
#   lint       ruff on everything, mypy (strict) on the pure packages (pyproject.toml)
#   keras3     malleable_tf's own tests again in .venv-keras3 (TensorFlow 2.21, Keras 3; Horovod
#              does not support it, so tests marked horovod are left out)
#   torch      malleable_torch's in .venv-torch (torch 2.13.0: `scripts/setup.sh --torch`)
#   tf-matrix  a subset of malleable_tf's in each .venv-tf-<version> (the versions between:
#              scripts/lib/tf-matrix.sh, made by `scripts/setup.sh --tf-matrix`)
# Usage: run_tests.sh                  every part, one after the other
#        run_tests.sh --part NAME...   those parts, in that order (scripts/ci.sh runs them in lanes:
#                                      cluster in one, tf215 and unit in the other)
#        run_tests.sh --tf-matrix      the same as --part tf-matrix
#        run_tests.sh PYTEST_ARGS      main only, with them (a focused run: -k, a file)
# Every part runs even when one before it failed; the exit is the first failure's.
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

part_main() {   # pytest's arguments, if any
  .venv/bin/python -m pytest -v -rfEs --durations=15 --ignore=tests/docker --ignore=tests/vm \
    --ignore=tests/torch "$@" tests
  check "TensorFlow 2.15 suite" $?
}

part_cluster() {
  .venv/bin/python -m pytest -v -rfEs --durations=15 --ignore="$MTF" tests/integration tests/site
  check "local clusters' suite" $?
}

part_tf215() {
  .venv/bin/python -m pytest -v -rfEs --durations=5 "$MTF"
  check "TensorFlow 2.15's malleable_tf suite" $?
}

part_unit() {
  .venv/bin/python -m pytest -v -rfEs --durations=5 tests/unit
  check "unit suite" $?
}

part_lint() {
  .venv/bin/ruff check . && .venv/bin/mypy
}

part_keras3() {
  echo "[test] Keras 3 suite: TensorFlow $(.venv-keras3/bin/python -c 'from importlib.metadata import version; print(version("tensorflow-cpu"))')"
  .venv-keras3/bin/python -m pytest -v -rfEs --durations=5 -m "not horovod" "${KERAS3_TESTS[@]}"
  check "Keras 3 suite" $?
}

part_torch() {
  echo "[test] PyTorch suite: torch $(.venv-torch/bin/python -c 'from importlib.metadata import version; print(version("torch"))')"
  .venv-torch/bin/python -m pytest -v -rfEs --durations=5 "${TORCH_TESTS[@]}"
  check "PyTorch suite" $?
}

part_tf-matrix() {   # the subset on each version between; 1 if any failed
  local version venv got start r failed=0
  for version in "${TF_MATRIX_VERSIONS[@]}"; do
    venv=".venv-tf-$version"
    start=$(date +%s)
    got=$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("tensorflow-cpu"))' 2>/dev/null)
    if [ "$got" != "$version" ]; then
      echo "[test] TensorFlow $version: $venv has ${got:-no tensorflow-cpu} (run scripts/setup.sh --tf-matrix)" >&2
      r=1
    else
      "$venv/bin/python" -m pytest -v -rfEs --durations=5 -m "not horovod" "${TF_MATRIX_TESTS[@]}"
      check "TensorFlow $version subset" $?; r=$?
    fi
    echo "[test] TensorFlow $version subset: exit $r in $(( $(date +%s) - start )) s"
    [ $r -ne 0 ] && failed=1
  done
  return $failed
}

PARTS=(main lint keras3 torch tf-matrix)   # every part, as run_tests.sh with no argument runs them
MAIN_PARTS=(cluster tf215 unit)           # main's, for --part

run_parts() {   # part names; each timed, all run; the first failure's exit
  local part start r rc=0
  for part in "$@"; do
    start=$(date +%s)
    "part_$part"; r=$?
    echo "[test] $part: exit $r in $(( $(date +%s) - start )) s"
    [ $rc -eq 0 ] && rc=$r
  done
  return $rc
}

case "${1:-}" in
  "") run_parts "${PARTS[@]}" ;;
  --tf-matrix) [ $# -eq 1 ] || { echo "run_tests.sh: --tf-matrix takes no argument" >&2; exit 2; }
               run_parts tf-matrix ;;
  --part)
    shift
    [ $# -gt 0 ] || { echo "run_tests.sh: --part needs one of: ${PARTS[*]} ${MAIN_PARTS[*]}" >&2; exit 2; }
    for part in "$@"; do
      [[ " ${PARTS[*]} ${MAIN_PARTS[*]} " == *" $part "* ]] ||
        { echo "run_tests.sh: no part $part (${PARTS[*]} ${MAIN_PARTS[*]})" >&2; exit 2; }
    done
    run_parts "$@" ;;
  *) part_main "$@" ;;
esac
