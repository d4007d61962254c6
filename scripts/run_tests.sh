#!/usr/bin/env bash
# Runs the whole test suite (unit and integration on the real local cluster).
# pytest exits 5 when it collected no test: that is a failure here, not a pass.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
.venv/bin/python -m pytest -v -rs --durations=15 "$@" tests
rc=$?
if [ $rc -eq 5 ]; then
  echo "[test] pytest collected no tests: failing" >&2
  exit 1
fi
exit $rc
