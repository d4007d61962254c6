# The two commands of the README. Each installs what it needs first (idempotent).
.PHONY: setup demo test unit

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/python scripts/demo.py

# The tests also run malleable_tf's own tests on Keras 3 (TensorFlow 2.21) in a second venv.
test:
	bash scripts/setup.sh --keras3
	bash scripts/run_tests.sh

unit:
	.venv/bin/python -m pytest -q tests/unit
