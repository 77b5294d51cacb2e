# sidestream — run `make help` for the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.test-deps
# What the build compiles: hand-written C, and each Python module Cython compiles (the .py
# beside each .pxd) with its .pxd.
PXD := $(wildcard middleware/*.pxd middleware/telemetry/*.pxd sidecar/*.pxd)
CORE_C := $(wildcard middleware/*.c middleware/telemetry/*.c sidecar/*.c) $(PXD) $(PXD:.pxd=.py)
SRC := middleware sidecar tests $(wildcard bench)
# The tiers `make test-py` runs on another Python (the system tier runs on $(PYTHON)).
PY ?= 3.12
PY_TIERS := tests/unit tests/asgi tests/sockets
# `make sanitize` builds in place with the venv's own setuptools and Cython (a new venv's
# bundled setuptools, 65 on 3.11, cannot read pyproject's SPDX `license`): each venv gets
# pyproject's [build-system] requires, read from there.
BUILD_REQUIRES = -m tests.support.build_requires
# llama.cpp for the `llamacpp` extra: PyPI has no Linux wheel, so pip compiles it, about
# 5 min on two shared cores, at the lowest priority so the machine's other work goes on.
# pip's wheel cache (~/.cache/pip) keeps the build of the pinned release: later installs take
# seconds. Portable (not -march=native), so the cached wheel fits any machine of this kind.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*?## "} /^[a-zA-Z_-]+:.*?## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml setup.py $(CORE_C)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/python $(BUILD_REQUIRES)
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

.PHONY: install
install: $(STAMP) ## Create .venv and install sidestream editable with the dev extra (quick when nothing changed).

# The image's dependencies, pinned with their hashes (Dockerfile, deploy/image-install.sh).
# Universal: one file for the amd64 and arm64 images alike. uv keeps the pins already in
# $(LOCK) that pyproject still allows: LOCK_ARGS=--upgrade moves them all to the newest.
# uv comes with the dev extra (`make install`).
LOCK ?= deploy/image.lock
.PHONY: lock
lock: $(BIN)/uv ## Regenerate deploy/image.lock, the image's pinned dependencies, from pyproject.toml (uv). LOCK_ARGS=--upgrade
	$(BIN)/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	  --custom-compile-command "make lock" --output-file $(LOCK) $(LOCK_ARGS) pyproject.toml

.PHONY: run
run: $(STAMP) ## Start the upstream emulator and the sidecar in front of it on localhost (Ctrl-C stops both).
	$(BIN)/python -m sidecar.demo

$(TEST_STAMP): $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" nice -n 19 $(BIN)/pip install --quiet -e '.[dev,llamacpp,system]'
	@touch $@

.PHONY: test-deps
test-deps: ## Install what the whole suite needs: the programs it runs (apt-get on Debian), then the llamacpp and system extras.
	@PYTHON=$(PYTHON) bash tests/support/system-deps.sh
	@$(MAKE) --no-print-directory $(TEST_STAMP)

.PHONY: test
test: test-deps ## Run the whole test suite (unit, asgi, sockets, system) with coverage, with the compiled core and then without it.
	$(BIN)/pytest --cov --cov-report=term:skip-covered $(PYTEST_ARGS)
	SIDESTREAM_NO_EXTENSIONS=1 $(BIN)/pytest $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: $(STAMP) ## Run the unit and asgi tiers only (nothing but .venv; under a minute).
	$(BIN)/pytest tests/unit tests/asgi $(PYTEST_ARGS)

.PHONY: test-py
test-py: test-py-$(PY) ## Run the unit, asgi and sockets tiers on another Python, both cores, in .venv-PY: make test-py PY=3.13

# make test-py-3.13: pyenv's newest 3.13.x, else python3.13 on PATH.
test-py-%: .venv-%/.installed
	.venv-$*/bin/pytest $(PY_TIERS) $(PYTEST_ARGS)
	SIDESTREAM_NO_EXTENSIONS=1 .venv-$*/bin/pytest $(PY_TIERS) $(PYTEST_ARGS)

.PRECIOUS: .venv-%/.installed
.venv-%/.installed: pyproject.toml setup.py $(CORE_C)
	@py=$$(pyenv root 2>/dev/null)/versions/$$(pyenv latest $* 2>/dev/null)/bin/python; \
	[ -x "$$py" ] || py=$$(command -v python$*) || { \
	  echo "make: no Python $* here: \`pyenv install $*\` installs it" >&2; exit 1; }; \
	echo "$$py -m venv .venv-$*"; "$$py" -m venv .venv-$*
	.venv-$*/bin/pip install --quiet --upgrade pip
	.venv-$*/bin/python $(BUILD_REQUIRES)
	.venv-$*/bin/pip install --quiet -e '.[dev]'
	@touch $@

.PHONY: sanitize
sanitize: $(STAMP) ## Build every C extension with ASan + UBSan (in build/sanitize) and run the twin tests and the differential fuzz on it. SIDESTREAM_FUZZ_SCALE=3
	$(BIN)/python -m tests.support.sanitize

.PHONY: soak
soak: $(STAMP) ## Soak: 2 min of mixed traffic at 300 streams (aborts, upstream failures, slow readers); fails on a leak. SOAK_ARGS="--duration 600"
	$(BIN)/python -m bench.soak $(SOAK_ARGS)

.PHONY: bench
bench: $(STAMP) ## Quick benchmark: sidestream as shipped, then telemetry off, direct, nginx; 5 reps (~12 min).
	$(BIN)/python -m bench

.PHONY: bench-full
bench-full: $(STAMP) ## Full benchmark: 7 repetitions, 2,000 and 9,000 idle streams (~25 min).
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
	rm -rf $(VENV) .venv-3.* .pytest_cache .mypy_cache .ruff_cache .hypothesis .coverage htmlcov *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
