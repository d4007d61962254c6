# The two commands of the README. Each installs what it needs first (idempotent).
.PHONY: setup demo test unit

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/python scripts/demo.py

test: setup
	bash scripts/run_tests.sh

unit:
	.venv/bin/python -m pytest -q tests/unit
