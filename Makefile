# The two commands of the README. Each installs what it needs first (idempotent).
.PHONY: setup demo test test-tf-all unit site-slurm test-site test-v2 test-slurm26 test-topology \
        test-smd

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/python scripts/demo.py

# The tests: scripts/ci.sh (its header says which stage runs in which lane, and why). Every suite:
# local clusters, docker-slurm on Slurm 22.05 and 24.11, the VMs (cgroup v2, 26.05), ruff and
# mypy, TensorFlow 2.15, 2.17, 2.19 and 2.21, PyTorch 2.13.0, the unit tests.
test:
	bash scripts/ci.sh

# The subset on every TensorFlow between 2.15 and 2.21 (2.16 to 2.20), not only make test's.
test-tf-all:
	MALLEABLE_TF_MATRIX=all bash scripts/setup.sh --tf-matrix
	MALLEABLE_TF_MATRIX=all bash scripts/run_tests.sh --tf-matrix

unit:
	.venv/bin/python -m pytest -q tests/unit

# Slurm as most sites build it (no multiple-slurmd: /slurm, slurmstepd.scope), from Debian's
# source, cached in its own prefix; tests/site runs the end-to-end suite on it.
site-slurm:
	bash scripts/build-slurm-production.sh

test-site: site-slurm
	bash scripts/setup.sh
	.venv/bin/python -m pytest -v -rfEs tests/site

# Slurm 26.05 (Debian sid's): in docker-slurm's containers (cgroup v1), its SPANK plugin built
# against 26.05's libslurm, its JSON read, the end-to-end tests; then in vm-slurm's virtual
# machines (cgroup v2), the guide's install and every VM scenario, twice: job folders named by
# job id (CgroupJobIdPaths=yes), then by SLUID (Slurm's default).
test-slurm26:
	bash scripts/setup.sh
	$(MAKE) -C docker-slurm test SUITE=sid
	$(MAKE) -C vm-slurm test SUITE=sid
	$(MAKE) -C vm-slurm test SUITE=sid JOB_ID_PATHS=no

# Slurm 24.11 and 22.05 (Debian 12's, whose Prolog takes one program) on cgroup v2: virtual
# machines of their own (images cached), tested, stopped.
test-v2:
	bash scripts/setup.sh
	$(MAKE) -C vm-slurm test
	$(MAKE) -C vm-slurm test SUITE=bookworm

# SchedMD's own packages (slurm-smd-*, 24.11.5, built once from their source's debian/ by
# scripts/build-slurm-smd.sh) in place of Debian's, in the VMs: the guide's install and every VM
# scenario, a sackd login host included.
test-smd:
	bash scripts/setup.sh
	$(MAKE) -C vm-slurm test SUITE=bookworm SLURM_BUILD=smd

# A node whose CPUs Linux numbers as a two-socket Intel server does (threads i and i + 4, sockets
# alternating), not in Slurm's abstract order: vm-slurm's vm2, the topology scenario only.
test-topology:
	bash scripts/setup.sh
	$(MAKE) -C vm-slurm test-topology
