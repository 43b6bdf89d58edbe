"""Runs under the JAX venv (tests/tpu_inference/conftest.py: run_jax): tpu-inference's own answers, as JSON.

stdin: {"paddings": [[max_num_seqs, max_num_batched_tokens, gap, packing], ...],
        "scheduler": [[max_num_seqs, max_num_batched_tokens, max_model_len, enable_chunked_prefill], ...],
        "architectures": [architecture, ...] (resolved_implementations)}
stdout (last line): {"paddings": [{tokens, reqs, attn_reqs}...], "flags": {...}, "attention_error": float,
                     "attention_error_hd64": float, "mla_attention_error": float, ...}
"""

import json
import os
import sys

request = json.load(sys.stdin)
launch = {var: os.environ.get(var, "") for var in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")}
import tpu_inference.env_override  # noqa: E402,F401  (what a vLLM-TPU process adds to the launch flags)

flags = {var: os.environ.get(var, "").split() for var in launch}

from tpu_inference.runner import utils as runner_utils  # noqa: E402
from tpu_inference.runner.tpu_runner import MIN_NUM_SEQS  # noqa: E402
from vllm.utils.math_utils import next_power_of_2  # noqa: E402

paddings = []
for seqs, tokens, gap, packing in request["paddings"]:
    max_reqs = max(seqs, MIN_NUM_SEQS)
    paddings.append({
        "tokens": runner_utils.build_token_paddings(max(16, next_power_of_2(packing)), tokens, gap),
        "reqs": runner_utils.get_req_paddings(MIN_NUM_SEQS, max_reqs),
        "attn_reqs": runner_utils.get_attn_req_paddings(MIN_NUM_SEQS, seqs),
    })

from vllm.config import SchedulerConfig  # noqa: E402

from tpu_inference.models.common import model_loader  # noqa: E402
from tpu_inference.platforms.tpu_platform import TpuPlatform  # noqa: E402


def accepts(seqs: int, tokens: int, length: int, chunked: bool | None) -> bool:
    try:
        SchedulerConfig(max_num_batched_tokens=tokens, max_num_seqs=seqs, max_model_len=length,
                        is_encoder_decoder=False, **({} if chunked is None else {"enable_chunked_prefill": chunked}))
    except ValueError:
        return False
    return True


scheduler = [accepts(*case) for case in request.get("scheduler", [])]


def three_sequences(rng, seqs: int, pages: int, pages_per_seq: int):
    """The kernels' metadata (kv_lens, page_indices, cu_q_lens, distribution) for a chunked prefill, a decode
    and a fresh prefill in a batch of `seqs`, on shuffled pages; and the number of real tokens."""
    import jax.numpy as jnp
    import numpy as np

    q_lens, kv_lens = [5, 1, 10], [20, 7, 10]
    cu = np.zeros(seqs + 1, np.int32)
    cu[1:4] = np.cumsum(q_lens)
    cu[4:] = cu[3]
    lens = np.zeros(seqs, np.int32)
    lens[:3] = kv_lens
    page_indices = rng.permutation(pages)[:seqs * pages_per_seq].astype(np.int32)
    metadata = (jnp.asarray(lens), jnp.asarray(page_indices), jnp.asarray(cu), jnp.asarray(np.array([0, 0, 3], np.int32)))
    return metadata, int(cu[3])


def attention_error(hd64: bool = False) -> float:
    """The CPU twin's jitted attention against tpu-inference's reference (a Python loop, eager): the RPA v3
    kernel's, or (hd64) the head_dim-64 kernel's with attention sinks and its own cache layout."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from tpu_inference.kernels.ragged_paged_attention.v3 import kernel, kernel_hd64

    from aotc.runners.tpu_inference.twin import attention as twin_attention

    rng = np.random.default_rng(0)
    tokens, q_heads, kv_heads, dim, page, pages_per_seq, seqs, pages = 32, 4, 2, 64 if hd64 else 16, 16, 4, 8, 40
    cache_shape = (kernel_hd64 if hd64 else kernel).get_kv_cache_shape(pages, page, kv_heads, dim, jnp.bfloat16)
    q, k, v = (jnp.asarray(rng.standard_normal((tokens, h, dim)), jnp.bfloat16) for h in (q_heads, kv_heads, kv_heads))
    cache = jnp.asarray(rng.standard_normal(cache_shape), jnp.bfloat16)
    metadata, real = three_sequences(rng, seqs, pages, pages_per_seq)
    args = (q, k, v, cache, *metadata)
    if hd64:
        args += (jnp.asarray(rng.standard_normal(q_heads), jnp.float32),)  # the sinks
        reference, twin = kernel_hd64.ref_ragged_paged_attention_hd64, twin_attention.ragged_paged_attention_hd64
    else:
        reference, twin = kernel.ref_ragged_paged_attention, twin_attention.ragged_paged_attention
    want_out, want_cache = reference(*args, sm_scale=0.25, sliding_window=8)
    out, new_cache = jax.jit(lambda *a: twin(*a, sm_scale=0.25, sliding_window=8))(*args)
    return max(float(np.abs(np.asarray(want_out, np.float32) - np.asarray(out[:real], np.float32)).max()),
               float(np.abs(np.asarray(want_cache, np.float32) - np.asarray(new_cache, np.float32)).max()),
               float(np.abs(np.asarray(out[real:], np.float32)).max()))


def mla_attention_error() -> float:
    """The CPU twin's jitted MLA v2 against tpu-inference's MLA reference (v1's, a Python loop over sequences,
    with the same cache layout: each token's latent then its rope key, each padded to 128 lanes, packed in
    pairs of bf16 tokens). v2 takes the queries head-major and returns the output head-major, unpadded."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from tpu_inference.kernels.mla.v1.kernel import ref_mla_ragged_paged_attention
    from tpu_inference.kernels.mla.v2.kernel import get_kv_cache_shape

    from aotc.runners.tpu_inference.twin import attention as twin_attention

    rng = np.random.default_rng(1)
    tokens, heads, lkv, rope, page, pages_per_seq, seqs, pages = 32, 4, 32, 16, 16, 4, 8, 40
    cache = jnp.asarray(rng.standard_normal(get_kv_cache_shape(pages, page, 128 + 128, jnp.bfloat16)), jnp.bfloat16)
    ql_nope, q_pe = (jnp.asarray(rng.standard_normal((tokens, heads, d)), jnp.bfloat16) for d in (lkv, rope))
    kv_c, k_pe = (jnp.asarray(rng.standard_normal((tokens, d)), jnp.bfloat16) for d in (lkv, rope))
    metadata, real = three_sequences(rng, seqs, pages, pages_per_seq)
    # the reference donates the cache it is given
    want_out, want_cache = ref_mla_ragged_paged_attention(ql_nope[:real], q_pe[:real], kv_c[:real], k_pe[:real],
                                                          jnp.copy(cache), *metadata, sm_scale=0.25)
    out, new_cache = jax.jit(lambda *a: twin_attention.mla_ragged_paged_attention(*a, sm_scale=0.25))(
        jnp.swapaxes(ql_nope, 0, 1), q_pe, kv_c, k_pe, cache, *metadata)
    out = np.asarray(jnp.swapaxes(out, 0, 1), np.float32)
    return max(float(np.abs(np.asarray(want_out[..., :lkv], np.float32) - out[:real]).max()),
               float(np.abs(np.asarray(want_cache, np.float32) - np.asarray(new_cache, np.float32)).max()),
               float(np.abs(out[real:]).max()))


def grid_jitted_vision_architectures() -> list[str]:
    """vLLM's multimodal architectures whose vision tower tpu-inference jits with each encoder batch's image grids as
    a static argument: the stack's own predicate (vision_tower_jit.has_jittable_vision) on an instance of each class.
    Only the model modules that name one of those classes, or a subclass found so far, are imported."""
    import importlib
    import importlib.util
    from pathlib import Path

    from tpu_inference.models.vllm.experimental import qwen3_vl_patcher, vision_tower_jit
    from vllm.model_executor.models.registry import _MULTIMODAL_MODELS, _resolve_module_name

    modules = {module: _resolve_module_name(module) for module, _ in _MULTIMODAL_MODELS.values()}
    sources = {module: Path(importlib.util.find_spec(name).origin).read_text() for module, name in modules.items()}
    names = {cls.__name__ for cls in (qwen3_vl_patcher.Qwen3VLForConditionalGeneration,
                                      *vision_tower_jit.JITTABLE_ARCHS)}
    found: set[str] = set()
    while True:
        before = set(names)
        for arch, (module, class_name) in _MULTIMODAL_MODELS.items():
            if arch in found or not any(name in sources[module] for name in names):
                continue
            cls = getattr(importlib.import_module(modules[module]), class_name)
            if vision_tower_jit.has_jittable_vision(cls.__new__(cls)):
                found.add(arch)
                names.add(class_name)
        if names == before:
            return sorted(found)


def multimodal_class(arch: str) -> type:
    """vLLM's class for a multimodal architecture of its registry, its module imported."""
    import importlib

    from vllm.model_executor.models.registry import _MULTIMODAL_MODELS, _resolve_module_name

    module, class_name = _MULTIMODAL_MODELS[arch]
    return getattr(importlib.import_module(_resolve_module_name(module)), class_name)


def qwen3_vl_overrides(architectures: list[str]) -> dict[str, list[str]]:
    """For each of these architectures whose vLLM class subclasses Qwen3-VL's (which the stack's qwen3_vl_patcher
    patches by isinstance): the methods of Qwen3-VL's class it defines anew."""
    import inspect

    from tpu_inference.models.vllm.experimental.qwen3_vl_patcher import Qwen3VLForConditionalGeneration as Qwen3VL

    overrides = {}
    for arch in architectures:
        cls = multimodal_class(arch)
        if issubclass(cls, Qwen3VL):
            overrides[arch] = sorted(name for name in dir(Qwen3VL) if callable(getattr(Qwen3VL, name))
                                     and not name.startswith("__")
                                     and inspect.getattr_static(cls, name) is not inspect.getattr_static(Qwen3VL, name))
    return overrides


def merges_with_vllms_own(architectures: list[str]) -> dict[str, bool]:
    """For each: whether its vLLM class's module holds vLLM's own _merge_multimodal_embeddings under that name (an
    import of it, which the fixes swap while their jit traces; Qwen3-VL's module holds it too until the stack's
    patches replace it with theirs at model load)."""
    import sys

    import vllm.model_executor.models.utils as vllm_model_utils

    return {arch: getattr(sys.modules[multimodal_class(arch).__module__], "_merge_multimodal_embeddings", None)
            is vllm_model_utils._merge_multimodal_embeddings for arch in architectures}


def resolved_implementations(architectures: list[str]) -> dict[str, dict[str, str]]:
    """model_loader.resolve_model_impl_type under MODEL_IMPL_TYPE and DRAFT_MODEL_IMPL_TYPE auto, for each
    architecture as a target's and as a draft's."""
    from types import SimpleNamespace

    def config(architecture):
        hf = SimpleNamespace(architectures=[architecture])
        return SimpleNamespace(load_config=SimpleNamespace(load_format="auto"),
                               model_config=SimpleNamespace(hf_config=hf),
                               speculative_config=SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf)))

    return {arch: {role: model_loader.resolve_model_impl_type(config(arch), is_draft_model=role == "draft")
                   for role in ("target", "draft")} for arch in architectures}


def stack_lines() -> dict[str, bool]:
    """Whether tpu-inference's code still holds the lines three plan rules stand on (whitespace aside):
    a multimodal model served as text when every listed modality limit is 0; a step with image embeddings
    passing no input ids, which the rejection sampler asserts; a draft refused on another implementation."""
    import inspect

    from tpu_inference.runner.tpu_runner import TPUModelRunner
    from tpu_inference.spec_decode.jax.dflash import DFlashProposer
    from tpu_inference.spec_decode.jax.eagle3 import Eagle3Proposer

    def code(function) -> str:
        return " ".join(inspect.getsource(function).split())

    return {
        "text_only_at_zero_limits": "if mm_limits and all(limit.count == 0 for limit in mm_limits.values()): "
                                    "disable_mm_from_limits = True" in code(TPUModelRunner.load_model),
        "image_steps_pass_no_input_ids": "return None, inputs_embeds" in code(TPUModelRunner._get_input_ids_embeds),
        "rejection_needs_input_ids": "assert input_ids is not None draft_token_ids = self._extract_draft_token_ids("
                                     in code(TPUModelRunner._sample_from_logits),
        "draft_on_target_implementation": all("if draft_model_impl != target_model_impl: raise ValueError("
                                              in code(proposer.load_model)
                                              for proposer in (Eagle3Proposer, DFlashProposer)),
    }


grid_jitted_vision = grid_jitted_vision_architectures()
print(json.dumps({"paddings": paddings, "flags": flags, "attention_error": attention_error(),
                  "attention_error_hd64": attention_error(hd64=True), "mla_attention_error": mla_attention_error(),
                  "scheduler": scheduler, "grid_jitted_vision": grid_jitted_vision,
                  "qwen3_vl_overrides": qwen3_vl_overrides(grid_jitted_vision),
                  "merges_with_vllms_own": merges_with_vllms_own(grid_jitted_vision),
                  "quantizations": list(TpuPlatform.supported_quantization),
                  "vllm_preferred": sorted(model_loader._VLLM_PREFERRED_ARCHITECTURES),
                  "resolved_implementations": resolved_implementations(request.get("architectures", [])),
                  "stack_lines": stack_lines()}))
