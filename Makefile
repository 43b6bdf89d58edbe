# aotc — every target installs what it needs first (a venv keyed by the lock file, reused across runs).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
UV_VERSION := 0.13.9
LOCK := requirements/full.lock
AOTC_HOME ?= $(HOME)/.cache/aotc
VENV ?= $(AOTC_HOME)/venv-full-$(shell sha256sum $(LOCK) | cut -c1-12)
BIN := $(VENV)/bin
# The tpu-inference runner's stack (JAX, vllm-tpu 0.32) conflicts with the torch_xla one and ships
# cp312 wheels only: its own venv, keyed by its own lock, under Python 3.12.
JAX_LOCK := requirements/jax.lock
JAX_VENV ?= $(AOTC_HOME)/venv-jax-$(shell sha256sum $(JAX_LOCK) | cut -c1-12)
JAX_PYTHON ?= $(shell for p in python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12); do \
	"$$p" -c "" 2>/dev/null && command -v "$$p" && break; done)
# How the core finds the runner's interpreter (aotc/build.py: runner_python).
export AOTC_PYTHON_TPU_INFERENCE ?= $(JAX_VENV)/bin/python
UV = $(shell command -v uv || echo $(AOTC_HOME)/uv-$(UV_VERSION)/bin/uv)
STORE ?= .aotc/store
ARTIFACTS ?= .aotc/artifacts
DEMO ?= configs/demo.yaml
PYTEST_ARGS ?=

.PHONY: env env-jax build-cache test test-fast bench lock clean help

help:
	@echo "make build-cache   build, verify and publish $(DEMO) to $(STORE)"
	@echo "make test          install what is missing (both venvs), then run the whole suite (slow tests included)"
	@echo "make env-jax       the tpu-inference (JAX) runner's venv, keyed by requirements/jax.lock"
	@echo "make test-fast     the suite without the slow end-to-end tests"
	@echo "make bench         benchmarks (store fetch, build overhead and --jobs scaling)"
	@echo "make lock          re-resolve requirements/*.lock from pyproject.toml"

# The stack is ~10 GB: install it once per lock into $(VENV); later runs only re-link aotc itself.
$(VENV)/.installed: $(LOCK)
	@test -x "$(UV)" || $(PYTHON) -m pip install -q --target $(AOTC_HOME)/uv-$(UV_VERSION) "uv==$(UV_VERSION)"
	$(UV) venv -q --allow-existing -p $(PYTHON) $(VENV)
	$(UV) pip sync -q --compile-bytecode --python $(BIN)/python $(LOCK)
	touch $@

env: $(VENV)/.installed
	@$(UV) pip install -q --python $(BIN)/python --no-deps --link-mode copy --reinstall-package aotc -e .

$(JAX_VENV)/.installed: $(JAX_LOCK)
	@test -n "$(JAX_PYTHON)" || { echo "env-jax: no Python 3.12 found; set JAX_PYTHON=/path/to/python3.12" >&2; exit 2; }
	@test -x "$(UV)" || $(PYTHON) -m pip install -q --target $(AOTC_HOME)/uv-$(UV_VERSION) "uv==$(UV_VERSION)"
	$(UV) venv -q --allow-existing -p $(JAX_PYTHON) $(JAX_VENV)
	@# --compile-bytecode: ~3.5 min once, instead of ~45 s of source compiling in every runner process
	@# where PYTHONDONTWRITEBYTECODE is set (CI, this machine) and no .pyc is ever cached.
	$(UV) pip sync -q --compile-bytecode --python $(JAX_VENV)/bin/python $(JAX_LOCK)
	touch $@

# aotc itself goes in too: the runner module and the CPU twin's vllm.general_plugins entry point.
env-jax: $(JAX_VENV)/.installed
	@$(UV) pip install -q --python $(JAX_VENV)/bin/python --no-deps --link-mode copy --reinstall-package aotc -e .

# A matrix on the tpu-inference runner also needs the JAX venv.
build-cache: env $(if $(shell grep -l 'runner: *tpu-inference' $(DEMO) 2>/dev/null),env-jax)
	$(BIN)/aotc plan $(DEMO)
	$(BIN)/aotc build $(DEMO) --out $(ARTIFACTS)
	@for dir in $(ARTIFACTS)/*/; do $(BIN)/aotc verify $$dir || exit 1; done
	$(BIN)/aotc publish $(ARTIFACTS)/*/ --store $(STORE)
	$(BIN)/aotc report $(ARTIFACTS)/*/ --out $(ARTIFACTS)/report.html
	$(BIN)/aotc ls --store $(STORE)
	@echo "fetch in a pod: aotc fetch --config $(DEMO) --entry <name> --dest \$$VLLM_XLA_CACHE_PATH --store $(STORE)"

test: env env-jax
	$(BIN)/python -m pytest -m "" $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && echo "no tests ran" && exit 1; exit $$rc

test-fast: env
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

bench: env env-jax
	$(BIN)/python bench/bench_fetch.py
	$(BIN)/python bench/bench_build.py
	$(BIN)/python bench/bench_jax_startup.py

lock:
	$(UV) pip compile pyproject.toml --extra test --python-version 3.11 --python-platform x86_64-manylinux_2_31 --generate-hashes -q -o requirements/core.lock
	$(UV) pip compile pyproject.toml --extra full --extra test --python-version 3.11 --python-platform x86_64-manylinux_2_31 --generate-hashes -q -o $(LOCK)
	$(UV) pip compile pyproject.toml --extra jax --python-version 3.12 --python-platform x86_64-manylinux_2_31 --generate-hashes -q -o $(JAX_LOCK)

clean:
	rm -rf .aotc .pytest_cache
