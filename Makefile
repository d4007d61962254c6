# The two commands of the README. Each installs what it needs first (idempotent).
.PHONY: setup demo test unit

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/python scripts/demo.py

# The tests also run malleable_tf's own tests on Keras 3 (TensorFlow 2.21) in a second venv,
# then docker-slurm's end-to-end tests on Slurm 22.05 and 24.11 (containers of their own).
test:
	bash scripts/setup.sh --keras3
	rc=0; bash scripts/run_tests.sh || rc=$$?; \
	$(MAKE) -C docker-slurm test-all || rc=1; exit $$rc

unit:
	.venv/bin/python -m pytest -q tests/unit
