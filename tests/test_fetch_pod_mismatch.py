"""A pod's init container fetches with the core's venv only, and names what differs from the build:
XLA flags as JAX hashes them, the pinned KV block count; the runner's venv is not needed (nor is the KV
block count the stack sized at build: the init container takes the published one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aotc.fingerprint import fingerprint_entry
from aotc.fingerprint import entry_kv_blocks
from aotc.matrix import load_matrix

from .conftest import CONFIGS, run_aotc
from aotc.testing.artifacts import make_artifact

pytestmark = pytest.mark.needs_jax  # the build side fingerprints with the JAX venv's versions

DEMO = CONFIGS / "demo-jax.yaml"
ENTRY = "tiny-llama-jax--len128-seqs8-tok64-tp1"
# An init container: no runner interpreter, no flags of its own.
POD = {"AOTC_PYTHON_TPU_INFERENCE": "", "XLA_FLAGS": "", "LIBTPU_INIT_ARGS": "", "VLLM_ENABLE_V1_MULTIPROCESSING": "",
       "AOTC_REQUIRE": ""}
# The build: the runner's interpreter sizes the KV cache (make exports its path; a bare pytest leaves aotc to
# find the JAX venv itself, and collecting this module must not fail without it).
BUILD = {var: os.environ[var] for var in ["AOTC_PYTHON_TPU_INFERENCE"] if var in os.environ}


@pytest.fixture
def store(tmp_path) -> Path:
    """The store after a build: the artifact under the fingerprint the build computed (its own venv's versions,
    the KV block count its stack sized)."""
    fp = fingerprint_entry(load_matrix(DEMO).entry(ENTRY), BUILD)
    artifact = make_artifact(tmp_path / "art", entry=ENTRY, fingerprint=fp.digest, inputs=fp.inputs)
    proc = run_aotc("publish", artifact, "--store", tmp_path / "store")
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "store"


def fetch(store: Path, dest: Path, config: Path = DEMO, **env: str):
    return run_aotc("fetch", "--config", config, "--entry", ENTRY, "--dest", dest, "--store", store,
                    env={**POD, **env})


def test_init_container_without_the_runner_venv_fetches(store, tmp_path):
    proc = fetch(store, tmp_path / "dest")
    assert proc.returncode == 0, proc.stderr  # exit 3 before: versions read as None


def test_pod_whose_flags_differ_is_named(store, tmp_path):
    proc = fetch(store, tmp_path / "dest", XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    assert proc.returncode == 3 and "xla_flags" in proc.stderr, proc.stderr


def test_an_in_process_engine_fetches_the_servers_artifact(store, tmp_path):
    # one process imports tpu-inference once, a server's engine core twice: aotc's plugin collapses both to once
    proc = fetch(store, tmp_path / "dest", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    assert proc.returncode == 0, proc.stderr


def test_pod_whose_kv_size_differs_is_named(store, tmp_path):
    text = DEMO.read_text().replace("./models/tiny-llama", str(CONFIGS / "models" / "tiny-llama"))
    config = tmp_path / "pod.yaml"
    config.write_text(text.replace("  dtype: bfloat16", "  dtype: bfloat16\n  engine: {num_gpu_blocks_override: 33}"))
    proc = fetch(store, tmp_path / "dest", config=config)
    sized = entry_kv_blocks(load_matrix(DEMO).entry(ENTRY), BUILD)
    assert proc.returncode == 3 and f"kv_blocks: here 33, published {sized}" in proc.stderr, proc.stderr


def test_pod_whose_other_inputs_differ_is_not_told_the_sized_count_differs(store, tmp_path):
    """The init container cannot size the count; it takes the published one, so a miss names the real input."""
    proc = fetch(store, tmp_path / "dest", XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    assert proc.returncode == 3 and "xla_flags" in proc.stderr and "kv_blocks" not in proc.stderr, proc.stderr
