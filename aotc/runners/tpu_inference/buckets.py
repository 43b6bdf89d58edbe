"""tpu-inference's padding rules and precompile loops (vllm-tpu 0.32 / tpu-inference 0.32), as plain data.

Re-implemented, not imported, so that `aotc plan` runs on the core's Python without JAX;
tests/jax/test_plan_jax.py proves them equal to tpu-inference's own helpers under the JAX venv.
Families are `CompilationManager._precompile_*` steps, named after the jitted function they compile;
a shape is the scalar signature the manager logs for each `_run_compilation` ("Precompile X --> {...}").
Covered: a text-only model, one data-parallel rank, no speculative decoding, prefill context
parallelism, disaggregation or continue-decode — the engine arguments the matrix can express.
"""

from __future__ import annotations

from aotc.graphs import GraphSpec
from aotc.matrix import Entry
# MIN_NUM_SEQS = runner.utils.MIN_NUM_SEQS; token_paddings and req_paddings equal runner.utils' helpers
from aotc.runners.paddings import MIN_NUM_SEQS, next_power_of_2, page_size, req_paddings, token_paddings
from aotc.runners.paddings import kv_blocks as paddings_kv_blocks

MIN_TOKEN_BUCKET = 16  # tpu_inference.envs.MIN_TOKEN_BUCKET default
MAX_PRECOMPILE_PROMPT_TOKENS = 1024  # compilation_manager._precompile_gather_logprobs
DTYPE_BITS = {"bfloat16": 16, "float16": 16, "auto": 16, "float32": 32, "fp8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8}

# Plan order = the order the engine compiles them: sampling and logprobs before the KV cache exists
# (TPUWorker.initialize_from_config), then capture_model.
FAMILIES = ("sample", "gather_logprobs", "gather_prompt_logprobs", "backbone", "substitute_placeholder_token",
            "select_from_array", "compute_logits", "structured_decoding")


def build_token_paddings(min_token_size: int, max_token_size: int, padding_gap: int) -> list[int]:
    """runner.utils.build_token_paddings: the generated buckets capped at the budget, plus the budget."""
    budget = -(-max_token_size // min_token_size) * min_token_size
    generated = token_paddings(min_token_size, max_token_size, padding_gap)
    return sorted({p for p in generated if p <= budget} | {budget})


def attn_req_paddings(max_num_seqs: int) -> list[int]:
    """runner.utils.get_attn_req_paddings with ATTN_BUCKETIZED_NUM_REQS unset: max_num_seqs only."""
    return [max_num_seqs]


def kv_blocks(entry: Entry | dict) -> int:
    """The pinned KV page count (aotc/runners/paddings.py: kv_blocks) with this stack's page size."""
    e = entry if isinstance(entry, dict) else entry.to_dict()
    engine = e.get("engine") or {}
    page = engine.get("block_size") or page_size(e["max_model_len"])
    return paddings_kv_blocks(e["max_num_seqs"], e["max_model_len"], page, engine.get("num_gpu_blocks_override"))


def kv_packing(entry: Entry) -> int:
    kv_dtype = entry.engine.get("kv_cache_dtype") or "auto"
    bits = DTYPE_BITS.get(entry.dtype if kv_dtype == "auto" else kv_dtype, 16)
    return 32 // bits


def paddings_for(entry: dict) -> dict[str, list[int]]:
    """paddings() for an entry as the runner receives it (a dict)."""
    return paddings(Entry.from_dict(entry))


def paddings(entry: Entry) -> dict[str, list[int]]:
    gap = int(entry.env.get("VLLM_TPU_BUCKET_PADDING_GAP", 0))
    max_num_reqs = max(entry.max_num_seqs, MIN_NUM_SEQS)
    return {
        "tokens": build_token_paddings(max(MIN_TOKEN_BUCKET, next_power_of_2(kv_packing(entry))),
                                       entry.max_num_batched_tokens, gap),
        "reqs": req_paddings(MIN_NUM_SEQS, max_num_reqs),
        "attn_reqs": attn_req_paddings(entry.max_num_seqs),
    }


def capture_plan(entry: Entry, hf_config: dict | None = None) -> list[GraphSpec]:
    """Every `_run_compilation` call tpu-inference makes for this entry, in its order, each shape once."""
    if hf_config and any(k in hf_config for k in ("vision_config", "audio_config")):
        raise ValueError(f"{entry.name}: the tpu-inference runner does not plan multimodal models yet")
    p = paddings(entry)
    tokens, reqs = p["tokens"], p["reqs"]
    graphs = [GraphSpec.of("sample", num_reqs=r, do_sampling=s, logprobs=lp, allow_distributed_sampling=True)
              for r in reqs for s in (True, False) for lp in (True, False)]
    graphs += [GraphSpec.of("gather_logprobs", num_reqs=r) for r in reqs]
    # above MAX_PRECOMPILE_PROMPT_TOKENS the stack's warm-up skips them; a server with prompt_logprobs reaches them
    graphs += [GraphSpec.of("gather_prompt_logprobs", num_tokens=t, beyond_warmup=t > MAX_PRECOMPILE_PROMPT_TOKENS)
               for t in tokens]
    graphs += [GraphSpec.of("backbone", num_tokens=t, num_reqs=r) for t in tokens for r in p["attn_reqs"]]
    # Async scheduling (vLLM's default): next tokens the size of the input, or of a request bucket.
    for n in sorted(set(tokens) | set(reqs)):
        for size in dict.fromkeys([n, *reqs]):
            graphs.append(GraphSpec.of("substitute_placeholder_token", num_tokens=n, next_tokens_size=size))
    graphs += [GraphSpec.of("select_from_array", array_size=t, index_size=r) for t in tokens for r in reqs if r <= t]
    graphs += [GraphSpec.of("compute_logits", num_reqs=r) for r in reqs]
    graphs += [GraphSpec.of("structured_decoding", num_reqs=r) for r in reqs]
    return graphs


# The CPU twin's virtual devices (one per tensor-parallel rank): XLA reads this flag when its CPU client starts.
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


# tpu_inference/layers/common/sharding.py MESH_AXIS_NAMES: the new-model mesh's axes, in order.
NEW_MODEL_MESH_AXES = ("data", "attn_dp", "attn_dp_expert", "expert", "model", "dcp", "pcp")


def mesh(entry: Entry) -> dict:
    """TPUModelRunner._init_mesh over the first dp * tp devices; sharding, and so every graph and its key,
    follows it. NEW_MODEL_DESIGN unset: _create_2d_mesh, axes (data, model) = (dp 1, tp). Set (models whose
    shardings name the expert axis, e.g. Llama 4): _create_new_model_mesh, every axis 1 but model = tp."""
    tp = entry.tensor_parallel_size
    if entry.env.get("NEW_MODEL_DESIGN"):
        return {"axes": {axis: tp if axis == "model" else 1 for axis in NEW_MODEL_MESH_AXES}, "devices": tp}
    return {"axes": {"data": 1, "model": tp}, "devices": tp}


def implied_flags(entry: Entry) -> dict[str, tuple[str, ...]]:
    """Launch flags the runner adds for this entry (in JAX's cache key): on the twin, tp > 1 needs as many
    virtual CPU devices. tp 1 adds nothing, so its keys stay those of a plain JAX-on-CPU process."""
    if entry.device == "cpu" and entry.tensor_parallel_size > 1:
        return {"XLA_FLAGS": (f"{DEVICE_COUNT_FLAG}={entry.tensor_parallel_size}",)}
    return {}


def bucket_summary(entry: Entry) -> dict:
    p = paddings(entry)
    return {"token_paddings": p["tokens"], "request_paddings": p["reqs"], "attention_request_paddings": p["attn_reqs"],
            "block_size": entry.engine.get("block_size") or page_size(entry.max_model_len), "mesh": mesh(entry)}


def implied_env(entry: Entry) -> dict[str, str]:
    """Runner variables this entry sets (fingerprint.runner_env): LoRA runs on vLLM's model code.

    tpu-inference 0.32 serves LoRA only through vLLM's model implementation (MODEL_IMPL_TYPE=vllm, run by
    torchax): its own JAX models load no LoRA manager, and a server started with --enable-lora on them
    fails at warm-up ("LoRA is not enabled"). An entry with enable_lora is built and served on that path."""
    return {"MODEL_IMPL_TYPE": "vllm"} if entry.engine.get("enable_lora") else {}
