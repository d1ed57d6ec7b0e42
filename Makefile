# `make demo` and `make test` are all a newcomer needs; both install what is missing first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := opensource,aws,docker,ssh,dev
PYTEST_ARGS ?=
INSTALL_LOG := .mat/install.log

.PHONY: install native demo test lint bench clean

install: $(STAMP)

# Quiet: pip's and setuptools' output (build warnings included) goes to $(INSTALL_LOG); on a failure its
# tail is shown. Without CUDA the CPU build of torch goes first, or pip pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml setup.py
	@echo "installing mat and its dependencies into $(VENV) (a few minutes the first time; log: $(INSTALL_LOG))"
	@mkdir -p $(dir $(INSTALL_LOG))
	@( bash scripts/install-system-deps.sh && \
	  { test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); } && \
	  $(BIN)/python -m pip install --quiet --upgrade pip && \
	  { command -v nvidia-smi >/dev/null 2>&1 || $(BIN)/python -m pip install --quiet torch==2.13.0; } && \
	  $(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]" \
	) > $(INSTALL_LOG) 2>&1 || { tail -n 30 $(INSTALL_LOG); echo "install failed; the whole log is $(INSTALL_LOG)"; exit 1; }
	@touch $(STAMP)

# Recompile the native corpus accelerators in place after editing multiagenttrainer/corpus/native/*.c.
native: install
	$(BIN)/python setup.py --quiet build_ext --inplace

# The quickstart trains a fixed number of steps per experiment, so what it prints does not depend on the
# machine's speed or load.
demo: install
	@$(BIN)/mat train --config configs/quickstart.yaml

test: install
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE DO_NOT_TRACK=1 \
		$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check multiagenttrainer flows tasks blocks deployments tests benchmarks
	$(BIN)/mypy

bench: install
	$(BIN)/python benchmarks/corpus_build.py

clean:
	rm -rf $(VENV) .mat corpus runs .pytest_cache
