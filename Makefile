# aotc — every target installs what it needs first (a venv keyed by the lock file, reused across runs).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
UV_VERSION := 0.13.9
# full.lock: the `full` extra (aotc[full]) = the core + the vllm-tpu runner's stack (torch_xla, vLLM 0.13).
LOCK := requirements/full.lock
AOTC_HOME ?= $(HOME)/.cache/aotc
VENV ?= $(AOTC_HOME)/venv-full-$(shell sha256sum $(LOCK) | cut -c1-12)
BIN := $(VENV)/bin
# The tpu-inference runner's stack (JAX, vLLM-TPU 0.32) conflicts with the torch_xla one and ships
# cp312 wheels only: its own venv, keyed by its own lock, under Python 3.12.
JAX_LOCK := requirements/jax.lock
JAX_VENV ?= $(AOTC_HOME)/venv-jax-$(shell sha256sum $(JAX_LOCK) | cut -c1-12)
JAX_PYTHON ?= $(shell for p in python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12); do \
	"$$p" -c "" 2>/dev/null && command -v "$$p" && break; done)
# How the core finds the runner's interpreter (RunnerSpec.python_env; aotc/fingerprint.py: runner_python).
export AOTC_PYTHON_TPU_INFERENCE ?= $(JAX_VENV)/bin/python
UV = $(shell command -v uv || echo $(AOTC_HOME)/uv-$(UV_VERSION)/bin/uv)
# uv from PyPI by hash, the same pins the images install (requirements/uv.lock holds uv==$(UV_VERSION))
INSTALL_UV = $(PYTHON) -m pip install -q --require-hashes --only-binary :all: --target $(AOTC_HOME)/uv-$(UV_VERSION) \
	-r requirements/uv.lock
STORE ?= .aotc/store
ARTIFACTS ?= .aotc/artifacts
# both backends by default (DEMO=configs/demo.yaml: the torch_xla one only)
DEMO ?= configs/demo.yaml configs/demo-jax.yaml
# the slowest tests' times in every run's log (CI's too): where the suite's minutes go, measured where it ran
PYTEST_ARGS ?= --durations=25
# pytest-xdist workers; each test module stays on one worker (--dist loadscope), so a module's shared build is
# built once; modules with the most slow tests go first (tests/conftest.py: CostliestModulesFirst), so the run ends
# on short ones. Most of the suite is one process waiting on another (an engine, a server), so two workers keep two
# cores busy. 0: one process. How long the suite takes: docs/testing.md.
TEST_WORKERS ?= 2

.PHONY: env env-jax build-cache test test-fast support-table bench lock images push-images pin-images clean help

help:
	@echo "make build-cache   build, verify and publish $(DEMO) to $(STORE), then each canary's verdict"
	@echo "make test          install what is missing (both venvs), then run the whole suite (slow tests included)"
	@echo "make env-jax       the tpu-inference (JAX) runner's venv, keyed by requirements/jax.lock"
	@echo "make test-fast     the fast tests on the core venv alone (no slow end-to-end tests, no JAX venv needed)"
	@echo "make support-table rewrite docs/support.md's generated table from the matrices, the suite's case lists and docs/support-records"
	@echo "make bench         benchmarks (store fetch and publish, build overhead and --jobs scaling, stock-server start-up cold vs fetched, TPU target vs twin)"
	@echo "make lock          re-resolve requirements/*.lock from pyproject.toml"
	@echo "make images        docker build the two images configs/k8s names (make -n images prints the commands)"
	@echo "make pin-images    after push-images: write the pushed images' digests into configs/k8s"

# The stack is ~10 GB: install it once per lock into $(VENV); later runs only re-link aotc itself.
$(VENV)/.installed: $(LOCK)
	@test -x "$(UV)" || $(INSTALL_UV)
	$(UV) venv -q --allow-existing -p $(PYTHON) $(VENV)
	$(UV) pip sync -q --compile-bytecode --python $(BIN)/python $(LOCK)
	touch $@

env: $(VENV)/.installed
	@$(UV) pip install -q --python $(BIN)/python --no-deps --link-mode copy --reinstall-package aotc -e .

$(JAX_VENV)/.installed: $(JAX_LOCK)
	@test -n "$(JAX_PYTHON)" || { echo "env-jax: no Python 3.12 found; set JAX_PYTHON=/path/to/python3.12" >&2; exit 2; }
	@test -x "$(UV)" || $(INSTALL_UV)
	$(UV) venv -q --allow-existing -p $(JAX_PYTHON) $(JAX_VENV)
	@# --compile-bytecode: ~3.5 min once, instead of ~45 s of source compiling in every runner process
	@# where PYTHONDONTWRITEBYTECODE is set (CI, this machine) and no .pyc is ever cached.
	$(UV) pip sync -q --compile-bytecode --python $(JAX_VENV)/bin/python $(JAX_LOCK)
	touch $@

# aotc itself goes in too: the runner module and the CPU twin's vllm.general_plugins entry point.
env-jax: $(JAX_VENV)/.installed
	@$(UV) pip install -q --python $(JAX_VENV)/bin/python --no-deps --link-mode copy --reinstall-package aotc -e .

# The default demo covers both backends; DEMO=one.yaml builds just that one. Each ends with the canary's
# verdict: the stock `vllm serve` from the store under vLLM's own load generator (aotc canary).
# A matrix on the tpu-inference runner also needs the JAX venv.
CANARY_REQUESTS ?= 500
build-cache: env $(if $(shell grep -l 'runner: *tpu-inference' $(DEMO) 2>/dev/null),env-jax)
	@for demo in $(DEMO); do \
	  $(BIN)/aotc plan $$demo && $(BIN)/aotc build $$demo --out $(ARTIFACTS)/$$(basename $$demo .yaml) || exit 1; \
	done
	@for dir in $(addsuffix /*/,$(addprefix $(ARTIFACTS)/,$(basename $(notdir $(DEMO))))); do \
	  $(BIN)/aotc verify $$dir || exit 1; done
	$(BIN)/aotc publish $(addsuffix /*/,$(addprefix $(ARTIFACTS)/,$(basename $(notdir $(DEMO))))) --store $(STORE)
	$(BIN)/aotc ls --store $(STORE)
	@failed=0; for demo in $(DEMO); do for dir in $(ARTIFACTS)/$$(basename $$demo .yaml)/*/; do \
	  $(BIN)/aotc canary $$demo --entry $$(basename $$dir) --store $(STORE) --requests $(CANARY_REQUESTS) --json \
	    > $${dir%/}.canary.json || failed=$$?; \
	  $(BIN)/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["verdict"])' $${dir%/}.canary.json \
	    || failed=1; \
	done; done; \
	$(BIN)/aotc report $(addsuffix /*/,$(addprefix $(ARTIFACTS)/,$(basename $(notdir $(DEMO))))) \
	  --out $(ARTIFACTS)/report.html; \
	exit $$failed
	@echo "fetch in a pod: aotc fetch --config <demo> --entry <name> --dest \$$VLLM_XLA_CACHE_PATH --store $(STORE)"

test: env env-jax
	$(BIN)/python -m pytest -m "" -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && echo "no tests ran" && exit 1; exit $$rc

# The core venv alone: tests that need the JAX venv are marked needs_jax (tests/conftest.py) and left out.
test-fast: env
	$(BIN)/python -m pytest -m "not slow and not needs_jax" -n $(TEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

# docs/support.md's table, from the matrices the suite builds and its case lists (tests/support_cases.py), with
# the figures the slow tests recorded into docs/support-records when run with AOTC_SUPPORT_RECORDS=docs/support-records.
# tests/test_support_table.py fails while the page is stale.
support-table: env
	$(BIN)/python -m tests.support_table --write

bench: env env-jax
	$(BIN)/python bench/bench_fetch.py
	$(BIN)/python bench/bench_publish.py
	$(BIN)/python bench/bench_build.py --jobs-scaling
	$(BIN)/python bench/bench_startup.py
	$(BIN)/python bench/bench_tpu_target.py --real configs/real-size-jax-tpu.yaml

lock:
	$(UV) pip compile pyproject.toml --extra test --python-version 3.11 --python-platform x86_64-manylinux_2_31 --generate-hashes -q -o requirements/core.lock
	$(UV) pip compile pyproject.toml --extra full --extra test --python-version 3.11 --python-platform x86_64-manylinux_2_31 --generate-hashes -q -o $(LOCK)
	$(UV) pip compile pyproject.toml --extra jax --python-version 3.12 --python-platform x86_64-manylinux_2_31 --generate-hashes -q -o $(JAX_LOCK)

# The images configs/k8s/*.yaml run (docker/Dockerfile): each stack's lock, the Python it was resolved for,
# tagged <registry>/<image>:<its vLLM package><version>-aotc<version>, the versions read from the lock and
# pyproject.toml. tests/test_images.py checks the manifests name exactly these and the locks are `make env`'s.
# The base image by digest (BASE_DIGESTS, one `<python version> sha256:<digest>` line each): no digest, no build.
# A release: `make images push-images pin-images`, which writes each pushed image's registry digest into the
# manifests (image: <tag>@sha256:<digest>; the all-zero placeholder in git pulls nothing).
REGISTRY ?= us-docker.pkg.dev/PROJECT/serving
DOCKER ?= docker
BASE_DIGESTS ?= docker/base-images.lock
K8S_DIR ?= configs/k8s
AOTC_VERSION = $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
pinned = $(shell sed -n 's/^$(1)==\([^ ]*\).*/\1/p' $(2))
IMAGE = $(REGISTRY)/vllm-tpu-aotc:vllm$(call pinned,vllm,$(LOCK))-aotc$(AOTC_VERSION)
JAX_IMAGE = $(REGISTRY)/vllm-tpu-jax-aotc:vllm-tpu$(call pinned,vllm-tpu,$(JAX_LOCK))-aotc$(AOTC_VERSION)
lock_python = $(shell sed -n 's/.*--python-version \([0-9.]*\).*/\1/p' $(1))
base_digest = $(or $(shell sed -n 's/^$(subst .,\.,$(1)) \(sha256:[0-9a-f]\{64\}\)$$/\1/p' $(BASE_DIGESTS)),$(error \
	no digest for python:$(1)-slim-bookworm in $(BASE_DIGESTS): add the line "$(1) sha256:<digest>", the digest \
	docker buildx imagetools inspect python:$(1)-slim-bookworm shows))
docker_build = $(DOCKER) build -f docker/Dockerfile --build-arg PYTHON=$(call lock_python,$(1)) \
	--build-arg BASE_DIGEST=$(call base_digest,$(call lock_python,$(1))) --build-arg LOCK=$(1) -t $(2) .
images:
	$(call docker_build,$(LOCK),$(IMAGE))
	$(call docker_build,$(JAX_LOCK),$(JAX_IMAGE))

push-images:
	$(DOCKER) push $(IMAGE)
	$(DOCKER) push $(JAX_IMAGE)

pin_image = digest=$$($(DOCKER) inspect --format '{{index .RepoDigests 0}}' $(1) \
	| sed -n 's/.*@\(sha256:[0-9a-f]\{64\}\)$$/\1/p'); \
	test -n "$$digest" || { echo "pin-images: $(1) has no registry digest (make push-images first)" >&2; exit 2; }; \
	sed -i "s|$(1)@sha256:[0-9a-f]*|$(1)@$$digest|" $(K8S_DIR)/*.yaml
pin-images:
	$(call pin_image,$(IMAGE))
	$(call pin_image,$(JAX_IMAGE))

clean:
	rm -rf .aotc .pytest_cache
