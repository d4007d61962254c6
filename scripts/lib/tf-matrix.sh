# The TensorFlow versions between .venv's 2.15.1 and .venv-keras3's 2.21.0 that malleable_tf is
# also tested on: `scripts/setup.sh --tf-matrix` gives each a virtualenv of its own,
# $REPO/.venv-tf-<version> (tensorflow-cpu==<version>), and scripts/run_tests.sh runs a subset of
# malleable_tf's tests in each. Sourced by both; the one place the lists are kept.
# `make test` (and CI, which has 60 minutes for everything) runs the odd minor versions; with
# MALLEABLE_TF_MATRIX=all (`make test-tf-all`) the even ones too (about 5 minutes more).
TF_MATRIX_VERSIONS=(2.17.1 2.19.1)
TF_MATRIX_MORE=(2.16.2 2.18.1 2.20.0)
if [ "${MALLEABLE_TF_MATRIX:-}" = all ]; then
  TF_MATRIX_VERSIONS=(2.16.2 2.17.1 2.18.1 2.19.1 2.20.0)
fi
