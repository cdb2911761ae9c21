PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Extras `make install` adds. langid-lingua (the lingua language-id backend, 96 MB) is here so that its
# tests run; `make install EXTRAS=dev` leaves it out.
EXTRAS ?= dev,langid-lingua,ray

.PHONY: install quickstart test test-fast bench lint clean gpu-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The package alone: what the pipeline needs (the quickstart installs only this, about 17 s less than
# the extras on two cores). Reinstall only when the package metadata or the pins change.
BASE_STAMP := $(VENV)/.installed-base

$(BASE_STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install --quiet -c constraints.txt torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e .
	touch $(BASE_STAMP)

# The extras on top of the package.
$(STAMP): $(BASE_STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

quickstart: $(BASE_STAMP)
	$(BIN)/smelt quickstart

# One pytest worker per core (pytest-xdist); each worker and what it starts keeps to one thread
# (tests/conftest.py). TEST_WORKERS=0 runs the tests in this process.
TEST_WORKERS ?= 2

test: install
	$(BIN)/python -m pytest tests -n $(TEST_WORKERS)

# Unit tests only: everything but the tests marked slow (end-to-end runs, compiled kernels, subprocesses).
test-fast: install
	$(BIN)/python -m pytest tests -m "not slow" -n $(TEST_WORKERS)

bench: install
	@for f in bench/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# The CUDA path end to end on one NVIDIA GPU in about 8 minutes (bench/gpu_check.py; docs/benchmarks.md,
# "GPU"). It runs smelt from this checkout (src on PYTHONPATH) with the venv's Python when there is one,
# else $(PYTHON): a GPU machine's own PyTorch serves. Without CUDA it exits 2; `make gpu-check
# ARGS=--dry-run` runs every item on the CPU at tiny shapes.
GPU_CHECK_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))

gpu-check:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_CHECK_PYTHON) bench/gpu_check.py $(ARGS)

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

clean:
	rm -rf $(VENV) runs .pytest_cache
