"""A vision-language model on vLLM 0.13's TPU runner (configs/multimodal-vllm-tpu.yaml: a tiny LLaVA 1.5).

The plan is vLLM's own `_precompile_mm_encoder` loops over its own `MultiModalBudget`; the twin's stand-in for
torch_xla's Pallas flash attention (the CLIP tower's attention on a TPU) is held to JAX's reference; the
entries vLLM 0.13 cannot serve images with are refused, each on the stack's own code; one build, verified on
another seed and served by the stock `vllm serve` with image requests among the load.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os

import pytest

# The full stack is the test venv's: missing, these imports fail the run instead of skipping it.
import torch
import vllm  # noqa: F401

from aotc.errors import MatrixError
from aotc.matrix import load_matrix, parse_matrix
from aotc.plan import plan_entry
from aotc.runners.vllm_tpu.plan import buckets
from aotc.runners.vllm_tpu.twin import attention as twin_attention

from ..conftest import CONFIGS, run_aotc
from .conftest import assert_built_as_planned, vllm_mm_budget, vllm_plan

CONFIG = CONFIGS / "multimodal-vllm-tpu.yaml"
ENTRY = load_matrix(CONFIG, check_stack=False).entries[0]
LLAVA = json.loads((CONFIG.parent / ENTRY.model / "config.json").read_text())


def test_the_entry_is_a_llava_on_the_cpu_twin():
    assert LLAVA["architectures"] == ["LlavaForConditionalGeneration"]
    assert (ENTRY.runner, ENTRY.device) == ("vllm-tpu", "cpu")


def test_the_plan_is_vllms_own_multimodal_warmup():
    """_precompile_mm_encoder first (the encoder per image count, the input embedding with and without
    images), then the text model's families, as vLLM 0.13's capture_model runs them."""
    plan = [g.to_dict() for g in plan_entry(ENTRY).graphs]
    assert plan == vllm_plan(ENTRY.to_dict())
    assert {"mm_encoder", "embed_inputs"} <= {g["family"] for g in plan}


@pytest.mark.parametrize("tokens,chunked,limit,seqs,model_len", [
    (128, False, None, 8, 128), (81, True, None, 8, 128), (256, True, 2, 8, 128), (400, True, None, 8, 256),
    (400, True, None, 2, 128), (256, False, 1, 8, 256), (1024, True, 3, 4, 256), (90, True, 1, 1, 90)])
def test_images_per_step_and_tokens_per_image_are_vllms_budget(tokens, chunked, limit, seqs, model_len):
    """buckets.max_images_per_batch and image_tokens equal vLLM's MultiModalBudget over the knobs it reads."""
    engine = {"enable_chunked_prefill": chunked, **({"limit_mm_per_prompt": {"image": limit}} if limit else {})}
    entry = dataclasses.replace(ENTRY, max_num_batched_tokens=tokens, max_num_seqs=seqs, max_model_len=model_len,
                         engine=engine)
    budget = vllm_mm_budget(entry.to_dict())
    assert buckets.image_tokens(LLAVA) == budget.max_tokens_by_modality["image"]
    assert buckets.max_images_per_batch(entry, LLAVA) == budget.max_items_per_batch_by_modality["image"]


def test_cpu_twin_flash_attention_matches_jax_reference():
    """twin_attention.flash_attention against the reference beside the Pallas kernel torch_xla calls
    (jax.experimental.pallas.ops.tpu.flash_attention), over vLLM's call (no mask) and a causal one with a bias."""
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas.ops.tpu.flash_attention import mha_reference_no_custom_vjp

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 81, 16, generator=gen).to(torch.bfloat16) for _ in range(3))
    bias = torch.randn(2, 3, 81, 81, generator=gen)
    for causal, ab in ((False, None), (True, bias)):
        ours = twin_attention.flash_attention(q, k, v, causal=causal, sm_scale=0.25, ab=ab)
        as_jax = [jnp.asarray(t.float().numpy()) for t in (q, k, v)]
        theirs = mha_reference_no_custom_vjp(*as_jax, ab=None if ab is None else jnp.asarray(ab.numpy()),
                                             causal=causal, sm_scale=0.25)
        assert ours.shape == q.shape and ours.dtype == q.dtype
        np.testing.assert_allclose(ours.float().numpy(), np.asarray(theirs), atol=2 ** -6, rtol=2 ** -7)


def test_the_twin_installs_its_flash_attention_where_vllm_imports_it():
    """vLLM's MultiHeadAttention imports torch_xla's flash_attention at each call (PALLAS, the TPU's only ViT
    backend): after the twin's install that name is the twin's."""
    import torch_xla.experimental.custom_kernel as custom_kernel
    from vllm.attention.layer import MultiHeadAttention
    from vllm.platforms.tpu import TpuPlatform

    assert "from torch_xla.experimental.custom_kernel import flash_attention" in inspect.getsource(
        MultiHeadAttention.forward)
    assert TpuPlatform.get_supported_vit_attn_backends() == [TpuPlatform.get_vit_attn_backend(16, torch.bfloat16)]
    twin_attention.install_vision_attention()
    assert custom_kernel.flash_attention is twin_attention.flash_attention


def matrix(engine: str, tokens: int, model: str) -> str:
    return (f"models: [{{name: m, model: {CONFIG.parent / 'models' / model}, runner: vllm-tpu, device: cpu, "
            f"engine: {engine}, matrix: {{max_model_len: [{min(tokens, 128)}], max_num_seqs: [8], "
            f"max_num_batched_tokens: [{tokens}]}}}}]")


@pytest.mark.parametrize("engine,tokens,model,reason", [
    ("{enable_chunked_prefill: false}", 128, "tiny-qwen2_5-vl", "not Qwen2_5_VLForConditionalGeneration"),
    ("{}", 128, "tiny-llava", "enable_chunked_prefill: vLLM 0.13 serves images on a TPU with chunked prefill off"),
    ("{enable_chunked_prefill: false}", 256, "tiny-llava", "lets one step encode 3 images"),
    ("{enable_chunked_prefill: false}", 64, "tiny-llava", "below one image's 81 tokens"),
])
def test_plan_refuses_what_vllm_013_cannot_serve_images_with(engine, tokens, model, reason):
    with pytest.raises(MatrixError) as refused:
        parse_matrix(matrix(engine, tokens, model))
    assert reason in str(refused.value)


def test_a_refused_entry_is_exit_2_with_one_line(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text(matrix("{}", 128, "tiny-llava"))
    proc = run_aotc("plan", path)
    assert proc.returncode == 2 and "enable_chunked_prefill" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_the_refusals_stand_on_the_stacks_own_code():
    """The two faults the refusals name, in vLLM 0.13's code (its TPU runner is frozen there): the runner
    caches a step's batched encoder output as one item, and the scheduler lets an image that starts a step be
    split, while the runner merges whole images only."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.tpu_model_runner import TPUModelRunner

    encode = inspect.getsource(TPUModelRunner._execute_mm_encoder)
    batched_as_one = ("if isinstance(curr_group_outputs, torch.Tensor):\n"
                      "                encoder_outputs.append(curr_group_outputs)")
    assert batched_as_one in encode
    assert "zip(mm_hashes_pos, encoder_outputs)" in encode
    assert "num_computed_tokens < start_pos" in inspect.getsource(Scheduler._try_schedule_encoder_inputs)
    assert "mm_embeds.append(encoder_output)" in inspect.getsource(TPUModelRunner._gather_mm_embeddings)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(`aotc build --json` entry report, artifact, store with it published): one build for the module."""
    from tests.helpers.canary import publish_copy

    out = tmp_path_factory.mktemp("llava")
    proc = run_aotc("build", CONFIG, "--out", out, "--no-reuse", "--json", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)["entries"][0]
    store, _ = publish_copy(out / ENTRY.name, tmp_path_factory.mktemp("store"), dict(os.environ))
    return report, out / ENTRY.name, store


@pytest.mark.slow
def test_build_compiles_every_planned_graph(built):
    report, artifact, _ = built
    assert_built_as_planned(ENTRY, report, artifact)


@pytest.mark.slow
def test_verify_with_images_misses_nothing_on_another_seed(built):
    report, artifact, _ = built
    proc = run_aotc("verify", artifact, "--json", "--seed", "7", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verified = json.loads(proc.stdout)
    assert verified["misses"] == 0 and verified["missed"] == []
    assert verified["replayed_graphs"] == report["files"]


@pytest.mark.slow
def test_canary_stock_server_serves_images_with_nothing_missing(built, announce):
    """The stock `vllm serve` from the fetched artifact, chat requests with images among the load: no graph
    compiled that the artifact lacks (torch_xla 2.9.0 compiles its cached ones again: counted, never a pass),
    every image request served."""
    from tests.helpers.canary import assert_kinds_served, canary, summary

    _, _, store = built
    code, doc, err = canary(CONFIG, ENTRY.name, store, dict(os.environ), requests=32)
    announce(summary(doc))
    assert code == 0, (doc.get("verdict"), doc.get("problems"), err[-2000:])
    assert doc["graphs_missing"] == [] and doc["serving"]["new_files"] == [] and doc["startup"]["new_files"] == []
    assert doc["kinds"]["images"]["ok"] == doc["kinds"]["images"]["sent"] > 0
    # no prompt exceeds max_num_batched_tokens with chunked prefill off: nothing to chunk
    assert_kinds_served(doc, lacking={"lora", "speculative", "chunked_prefill"})
