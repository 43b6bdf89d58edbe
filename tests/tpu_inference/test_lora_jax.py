"""LoRA end to end on the tpu-inference CPU twin, through the real CLI: an `enable_lora` entry builds (the
sweep mixing base-model and adapter requests in its batches), a fresh process loads every graph back with
0 misses, and the stock `vllm serve --enable-lora --lora-modules` compiles nothing after ready while its
requests name the base model and adapters mixed and an adapter is loaded and unloaded at run time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aotc.matrix import load_matrix
from aotc.plan import plan_entry

from .conftest import REPO
from .test_build_verify_jax import aotc

TINY_LLAMA = REPO / "configs" / "models" / "tiny-llama"
ENTRY = "tiny-llama-lora--len128-seqs8-tok64-tp1"
MATRIX = f"""\
defaults: {{runner: tpu-inference, device: cpu, accelerator: v6e-1, dtype: bfloat16,
           engine: {{enable_lora: true, max_loras: 2, max_lora_rank: 8, num_gpu_blocks_override: 65}}}}
models:
  - name: tiny-llama-lora
    model: {TINY_LLAMA}
    matrix: {{max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64], tensor_parallel_size: [1]}}
"""


@pytest.fixture(scope="module")
def built(jax_env, tmp_path_factory) -> tuple[Path, Path]:
    """(the matrix, the entry's artifact dir)."""
    out = tmp_path_factory.mktemp("lora")
    config = out / "lora.yaml"
    config.write_text(MATRIX)
    proc = aotc(jax_env, "build", config, "--out", out, "--traffic", "16", "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)["entries"][0]
    plan = plan_entry(load_matrix(config).entry(ENTRY))  # expected counts from the plan, never a snapshot
    assert report["graphs_with_keys"] == report["planned"] == len(plan.graphs)
    return config, out / ENTRY


@pytest.mark.slow
def test_lora_entry_builds_on_vllm_model_code_and_verifies_with_zero_misses(jax_env, built):
    _, artifact = built
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["inputs"]["engine"]["enable_lora"] is True
    assert manifest["inputs"]["env"]["MODEL_IMPL_TYPE"] == "vllm"
    proc = aotc(jax_env, "verify", artifact, "--traffic", "24", "--seed", "7", "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert result["misses"] == 0 and result["loadable"] is True


@pytest.mark.slow
def test_lora_canary_serves_adapters_and_base_mixed_with_no_compile_after_ready(jax_env, built, tmp_path):
    from tests.helpers.canary import assert_kinds_served, canary, publish_copy

    config, artifact = built
    store, _ = publish_copy(artifact, tmp_path, jax_env)
    code, doc, err = canary(config, ENTRY, store, jax_env)
    assert code == 0, (doc.get("verdict"), doc.get("problems"), err[-2000:])
    assert doc["compiles_at_startup"] == 0 and doc["compiles_after_ready"] == 0
    assert doc["requests"] >= 16 and doc["failed_requests"] == 0
    assert doc["adapters"] == ["aotc-lora", "aotc-lora-runtime"]  # served from start, and loaded at run time
    assert_kinds_served(doc, lacking={"speculative", "images"})
    assert doc["kinds"]["lora"]["ok"] > 0
