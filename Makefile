# `make demo` and `make test` are all a newcomer needs; both install what is missing first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := opensource,aws,docker,ssh,dev
PYTEST_ARGS ?=

.PHONY: install native demo test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py
	@bash scripts/install-system-deps.sh
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# Without CUDA, install the CPU build of torch first, or pip pulls a multi-GB CUDA build.
	@if ! command -v nvidia-smi >/dev/null 2>&1; then \
		$(BIN)/python -m pip install --quiet torch==2.13.0; fi
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	@touch $(STAMP)

# Recompile the native corpus accelerators in place after editing multiagenttrainer/corpus/native/*.c.
native: install
	$(BIN)/python setup.py --quiet build_ext --inplace

demo: install
	$(BIN)/mat train --config configs/quickstart.yaml

test: install
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE DO_NOT_TRACK=1 \
		$(BIN)/python -m pytest -m "not gpu" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check multiagenttrainer flows tasks blocks deployments tests benchmarks
	$(BIN)/mypy

bench: install
	$(BIN)/python benchmarks/corpus_build.py

clean:
	rm -rf $(VENV) .mat corpus runs .pytest_cache
