# sidestream — run `make help` for the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SRC := middleware sidecar tests $(wildcard bench)

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*?## "} /^[a-zA-Z_-]+:.*?## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml setup.py $(wildcard middleware/*.c middleware/telemetry/*.c sidecar/*.c)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

.PHONY: install
install: $(STAMP) ## Create .venv and install sidestream editable with the dev extra (quick when nothing changed).

.PHONY: run
run: $(STAMP) ## Start the upstream emulator and the sidecar in front of it on localhost (Ctrl-C stops both).
	$(BIN)/python -m sidecar.demo

.PHONY: test
test: $(STAMP) ## Run the whole test suite (unit, asgi, sockets, system) with coverage, with the compiled core and then without it.
	$(BIN)/pytest --cov --cov-report=term:skip-covered $(PYTEST_ARGS)
	SIDESTREAM_NO_EXTENSIONS=1 $(BIN)/pytest $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: $(STAMP) ## Run the unit and asgi tiers only (no sockets, no processes; seconds).
	$(BIN)/pytest tests/unit tests/asgi $(PYTEST_ARGS)

.PHONY: sanitize
sanitize: $(STAMP) ## Build every C extension with ASan + UBSan (in build/sanitize) and run the twin tests and the differential fuzz on it. SIDESTREAM_FUZZ_SCALE=10
	$(BIN)/python -m tests.support.sanitize

.PHONY: soak
soak: $(STAMP) ## Soak: 2 min of mixed traffic at 300 streams (aborts, upstream failures, slow readers); fails on a leak. SOAK_ARGS="--duration 600"
	$(BIN)/python -m bench.soak $(SOAK_ARGS)

.PHONY: bench
bench: $(STAMP) ## Quick benchmark: direct vs sidestream vs nginx vs tutorial proxy (~5 min).
	$(BIN)/python -m bench

.PHONY: bench-full
bench-full: $(STAMP) ## Full benchmark: 3 repetitions, 2,000 and 9,000 idle streams (~13 min).
	$(BIN)/python -m bench --full

.PHONY: lint
lint: $(STAMP) ## ruff format --check and ruff check.
	$(BIN)/ruff format --check $(SRC)
	$(BIN)/ruff check $(SRC)

.PHONY: check
check: lint ## lint, then mypy --strict on both packages and the benchmark.
	$(BIN)/mypy middleware sidecar bench

.PHONY: fmt
fmt: $(STAMP) ## Format and autofix with ruff.
	$(BIN)/ruff format $(SRC)
	$(BIN)/ruff check --fix $(SRC)

.PHONY: clean
clean: ## Remove the virtualenv and caches.
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .coverage htmlcov *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
