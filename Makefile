# aotc — every target installs what it needs first (a venv keyed by the lock file, reused across runs).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
UV_VERSION := 0.13.9
LOCK := requirements/full.lock
AOTC_HOME ?= $(HOME)/.cache/aotc
VENV ?= $(AOTC_HOME)/venv-full-$(shell sha256sum $(LOCK) | cut -c1-12)
BIN := $(VENV)/bin
UV = $(shell command -v uv || echo $(AOTC_HOME)/uv-$(UV_VERSION)/bin/uv)
STORE ?= .aotc/store
ARTIFACTS ?= .aotc/artifacts
DEMO ?= configs/demo.yaml
PYTEST_ARGS ?=

.PHONY: env build-cache test test-fast bench lock clean help

help:
	@echo "make build-cache   build, verify and publish $(DEMO) to $(STORE)"
	@echo "make test          install what is missing, then run the whole suite (slow tests included)"
	@echo "make test-fast     the suite without the slow end-to-end tests"
	@echo "make bench         benchmarks (store fetch, build overhead and --jobs scaling)"
	@echo "make lock          re-resolve requirements/*.lock from pyproject.toml"

# The stack is ~10 GB: install it once per lock into $(VENV); later runs only re-link aotc itself.
$(VENV)/.installed: $(LOCK)
	@test -x "$(UV)" || $(PYTHON) -m pip install -q --target $(AOTC_HOME)/uv-$(UV_VERSION) "uv==$(UV_VERSION)"
	$(UV) venv -q --allow-existing -p $(PYTHON) $(VENV)
	$(UV) pip sync -q --python $(BIN)/python $(LOCK)
	touch $@

env: $(VENV)/.installed
	@$(UV) pip install -q --python $(BIN)/python --no-deps --reinstall-package aotc -e .

build-cache: env
	$(BIN)/aotc plan $(DEMO)
	$(BIN)/aotc build $(DEMO) --out $(ARTIFACTS)
	@for dir in $(ARTIFACTS)/*/; do $(BIN)/aotc verify $$dir || exit 1; done
	$(BIN)/aotc publish $(ARTIFACTS)/*/ --store $(STORE)
	$(BIN)/aotc ls --store $(STORE)
	@echo "fetch in a pod: aotc fetch --config $(DEMO) --entry <name> --dest \$$VLLM_XLA_CACHE_PATH --store $(STORE)"

test: env
	$(BIN)/python -m pytest -m "" $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && echo "no tests ran" && exit 1; exit $$rc

test-fast: env
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

bench: env
	$(BIN)/python bench/bench_fetch.py
	$(BIN)/python bench/bench_build.py

lock:
	$(UV) pip compile pyproject.toml --extra test --python-version 3.11 --python-platform x86_64-manylinux_2_31 --generate-hashes -q -o requirements/core.lock
	$(UV) pip compile pyproject.toml --extra full --extra test --python-version 3.11 --python-platform x86_64-manylinux_2_31 --generate-hashes -q -o $(LOCK)

clean:
	rm -rf .aotc .pytest_cache
