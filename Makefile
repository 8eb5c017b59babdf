# make demo   set up .venv and run the main job
# make test   set up .venv and run the whole suite (kernels in the Triton interpreter)
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

.PHONY: demo test test-gpu test-fast bench setup clean mpi-runtime

setup: $(STAMP)

$(STAMP): setup.cfg setup.py requirements/test.txt requirements/cpu-machine.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(MAKE) --no-print-directory mpi-runtime
	$(BIN)/python -m pip install -q --disable-pip-version-check $(MACHINE_REQS) -r requirements/test.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . --config-settings editable_mode=compat
	touch $(STAMP)

# Open MPI from the distribution's packages, for triflux.distributed's MPIBackend and
# its tests (needs root and apt; elsewhere the MPI tests skip and say why)
mpi-runtime:
	@command -v mpiexec >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null; } || \
	  echo "note: Open MPI is not installed here; the MPI tests will skip"

demo: $(STAMP)
	$(BIN)/python -m triflux demo unet

test: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -n $(JOBS) tests

test-fast: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -x -q tests --ignore=tests/test_primitives.py

test-gpu: $(STAMP)
	TRIFLUX_TEST_REAL_GPU=1 HYPOTHESIS_PROFILE=gpu $(BIN)/python -m pytest tests

bench: $(STAMP)
	$(BIN)/python -m pytest perf --benchmark-only --benchmark-columns=min,median,mean,rounds -p no:xdist --benchmark-json=perf/cpu.json
	$(BIN)/python perf/report.py perf/cpu.json
	$(BIN)/python perf/interleaved.py 6

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis .benchmarks
