# make demo   set up .venv and run the main job
# make test   set up .venv and run the whole suite (kernels in the Triton interpreter),
#             then `make test-newest`
# make test-newest   the kernel suite again on the newest Triton and NumPy that
#             setup.cfg accepts (.venv-newest, requirements/newest.txt)
# make test-gpu   the same suite on a real GPU (kernels compiled by Triton)
# make bench  the benchmark suites (perf/)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# On a machine with an NVIDIA GPU use the torch and triton it has (venv sees
# the system site-packages); elsewhere install the pinned CPU build of torch.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
ifeq ($(HAS_GPU),1)
VENV_FLAGS := --system-site-packages
MACHINE_REQS :=
else
VENV_FLAGS :=
MACHINE_REQS := -r requirements/cpu-machine.txt
endif
STAMP  := $(VENV)/.installed
JOBS   ?= 2
# The second environment: the newest accepted Triton and NumPy (requirements/newest.txt;
# the oldest are .venv's). Tests run from the source tree (pytest.ini), nothing to install.
VENV_NEWEST  := .venv-newest
STAMP_NEWEST := $(VENV_NEWEST)/.installed
# What the newest Triton must pass: every kernel against the reference and the reference
# itself on the newest NumPy (test_primitives), each family's kernel edge cases, and the
# recurrent layers. The rest of the suite reaches the kernels only through these.
NEWEST_TESTS := tests/test_primitives.py $(wildcard tests/test_*_family.py) tests/test_recurrent_layers.py

.PHONY: demo test test-newest test-gpu test-fast bench setup clean mpi-runtime

setup: $(STAMP)

# triflux itself is installed editable: the tests and `make demo` run from the checkout,
# where the source tree comes first on sys.path anyway, so an installed copy would never be
# what runs (and would go stale); tests/test_wheel_install.py checks the real install, a wheel
$(STAMP): setup.cfg setup.py requirements/test.txt requirements/cpu-machine.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(MAKE) --no-print-directory mpi-runtime
	$(BIN)/python -m pip install -q --disable-pip-version-check $(MACHINE_REQS) -r requirements/test.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . --config-settings editable_mode=compat
	touch $(STAMP)

# --no-compile: no bytecode for all of torch up front (most of the install time);
# Python compiles what the tests import
$(STAMP_NEWEST): requirements/newest.txt
	test -x $(VENV_NEWEST)/bin/python || $(PYTHON) -m venv $(VENV_NEWEST)
	$(VENV_NEWEST)/bin/python -m pip install -q --disable-pip-version-check --no-compile -r requirements/newest.txt
	touch $(STAMP_NEWEST)

# Open MPI from the distribution's packages, for triflux.distributed's MPIBackend and
# its tests (needs root and apt; elsewhere the MPI tests skip and say why)
mpi-runtime:
	@command -v mpiexec >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null; } || \
	  echo "note: Open MPI is not installed here; the MPI tests will skip"

demo: $(STAMP)
	$(BIN)/python -m triflux demo unet

# both runs, even when the first fails; fails when either does
test: $(STAMP)
	status=0; TRITON_INTERPRET=1 $(BIN)/python -m pytest -n $(JOBS) tests || status=$$?; \
	$(MAKE) --no-print-directory test-newest || status=$$?; exit $$status

# HYPOTHESIS_PROFILE=newest: 4 examples per property test instead of 8 (tests/conftest.py)
test-newest: $(STAMP_NEWEST)
	TRITON_INTERPRET=1 HYPOTHESIS_PROFILE=newest $(VENV_NEWEST)/bin/python -m pytest -n $(JOBS) -q $(NEWEST_TESTS)

test-fast: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -x -q tests --ignore=tests/test_primitives.py

test-gpu: $(STAMP)
	TRIFLUX_TEST_REAL_GPU=1 HYPOTHESIS_PROFILE=gpu $(BIN)/python -m pytest tests

bench: $(STAMP)
	$(BIN)/python -m pytest perf --benchmark-only --benchmark-columns=min,median,mean,rounds -p no:xdist --benchmark-json=perf/cpu.json
	$(BIN)/python perf/report.py perf/cpu.json
	$(BIN)/python perf/interleaved.py 6

clean:
	rm -rf $(VENV) $(VENV_NEWEST) build *.egg-info .pytest_cache .hypothesis .benchmarks
