"""vLLM 0.13's own checks on an entry (RunnerSpec.validate): the front end's rules plus TpuPlatform's.
Held against vLLM's code by tests/vllm_tpu/test_matrix_rules.py."""

from __future__ import annotations

from aotc.runners import vllm_rules

BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # vllm.config.cache.BlockSize: `vllm serve --block-size` choices
QUANTIZATIONS = ("fp8", "tpu_int8", "compressed-tensors")  # vllm.platforms.tpu.TpuPlatform.supported_quantization
# vLLM 0.13's models with mamba-type layers, hybrid or attention-free (tests/vllm_tpu/test_matrix_rules.py reads them off
# its registry: interfaces.is_hybrid / is_attention_free)
STATEFUL_ARCHITECTURES = frozenset({
    "BambaForCausalLM", "FalconH1ForCausalLM", "FalconMambaForCausalLM", "GraniteMoeHybridForCausalLM",
    "JambaForCausalLM", "JambaForSequenceClassification", "KimiLinearForCausalLM", "Lfm2ForCausalLM",
    "Lfm2MoeForCausalLM", "Mamba2ForCausalLM", "MambaForCausalLM", "MiniMaxForCausalLM", "MiniMaxM1ForCausalLM",
    "MiniMaxText01ForCausalLM", "NemotronHForCausalLM", "NemotronH_Nano_VL_V2", "Plamo2ForCausalLM",
    "Qwen3NextForCausalLM", "Zamba2ForCausalLM",
})

# vLLM 0.13's MoE models that its TPU runner cannot build or route, by what stops each (tests/vllm_tpu/test_matrix_rules.py
# builds every MoE model of its registry on the twin's platform and reads these off): its attention backend takes
# no MLA, no sinks and no chunked local attention, and its MoE kernel path takes softmax top-k routing only
UNSERVED_MOE_ARCHITECTURES = {
    "DeepseekV2ForCausalLM": "MLA attention", "DeepseekV3ForCausalLM": "MLA attention",
    "DeepseekV32ForCausalLM": "MLA attention", "LongcatFlashForCausalLM": "MLA attention",
    "GptOssForCausalLM": "attention sinks",
    "Llama4ForCausalLM": "chunked local attention",
    "Ernie4_5_MoeForCausalLM": "MoE routing: score-correction bias",
    "Glm4MoeForCausalLM": "MoE routing: grouped top-k, score-correction bias, sigmoid scoring",
    "PhiMoEForCausalLM": "MoE routing: custom routing function",
}
WHERE_IT_STOPS = {
    "MLA attention": "PallasAttentionBackendImpl takes no MLA arguments (q_lora_rank), so the model's "
                     "constructor fails",
    "attention sinks": "PallasAttentionBackendImpl takes no sinks, so the model's constructor fails",
    "chunked local attention": "the Pallas backend has no builder for it (create_chunked_local_attention_backend "
                               "raises NotImplementedError in the model's constructor)",
    "MoE routing": "UnquantizedFusedMoEMethod.forward_tpu takes softmax top-k routing into silu experts only and "
                   "refuses the rest at the first forward",
}


def validate(entry, hf_config: dict | None) -> list[str]:
    problems = vllm_rules.common(entry, hf_config)
    block = entry.engine.get("block_size")
    if block is not None and block not in BLOCK_SIZES:
        problems.append(f"engine.block_size: {block} is not one of {list(BLOCK_SIZES)} (vllm serve --block-size choices, CacheConfig.BlockSize)")
    return (problems + vllm_rules.quantization(entry, QUANTIZATIONS, "TpuPlatform") + lora(entry)
            + speculative(entry) + data_parallel(entry) + stateful(hf_config) + unserved_moe(hf_config)
            + multimodal(entry, hf_config))


def lora(entry) -> list[str]:
    """vLLM 0.13's TPU runner cannot serve LoRA: tpu_model_runner.replace_set_lora wraps every LoRA layer's
    set_lora with a signature that still takes ``embeddings_tensor``, which LoRAModelManager no longer
    passes, so the first adapter activated (the warm-up's dummy one) fails with a TypeError; past that, its
    bgmv kernels (vllm/lora/ops/xla_ops) call JAX through torch_xla's torchax, which cannot import without
    flax, not part of vLLM's TPU install. A stock server with --enable-lora dies at start-up, so there is nothing to build for it."""
    if entry.engine.get("enable_lora"):
        return ["engine.enable_lora: vLLM 0.13's TPU runner cannot start with LoRA (its replace_set_lora passes "
                "embeddings_tensor, which set_lora no longer takes; its bgmv kernels need torchax, which needs flax); use runner: "
                "tpu-inference (vllm.v1.worker.tpu_model_runner.replace_set_lora)"]
    return []


def speculative(entry) -> list[str]:
    """TpuPlatform.check_and_update_config asserts that no speculative_config is set: a stock server with
    --speculative-config stops before it loads the model."""
    if entry.engine.get("speculative_config"):
        return ["engine.speculative_config: vLLM 0.13's TPU platform does not support speculative decoding "
                "(\"TPU does not support speculative decoding\", TpuPlatform.check_and_update_config); use runner: "
                "tpu-inference"]
    return []


def data_parallel(entry) -> list[str]:
    """vLLM 0.13's data-parallel engine core runs a dummy batch on a rank with no requests while another rank
    has some (DPEngineCoreProc.run_busy_loop -> execute_dummy_batch); TPUWorker has no execute_dummy_batch, so
    the first uneven step kills the server."""
    size = entry.engine.get("data_parallel_size") or 1
    if size > 1:
        return [f"engine.data_parallel_size: {size}: vLLM 0.13's TPU worker cannot serve data parallel (TPUWorker "
                "has no execute_dummy_batch, which DPEngineCoreProc calls on an idle rank); use runner: tpu-inference"]
    return []


def stateful(hf_config: dict | None) -> list[str]:
    """TPUModelRunner.get_kv_cache_spec gives a cache to Attention and MLAAttention layers and skips the rest, so
    a mamba-type layer's conv and recurrent state has nowhere to live (and initialize_kv_cache refuses a second
    KV cache type). Qwen3-Next stops before that, on a TPU as on the twin: its gated delta net asks the platform
    for current_device, which TpuPlatform lacks (None: "'NoneType' object is not callable")."""
    found = sorted(set((hf_config or {}).get("architectures") or []) & STATEFUL_ARCHITECTURES)
    if found:
        return [f"model: vLLM 0.13's TPU runner cannot serve {', '.join(found)}, whose mamba-type layers keep a "
                "recurrent state: TPUModelRunner.get_kv_cache_spec gives a cache to attention layers only "
                "(Qwen3-Next stops sooner: TpuPlatform has no current_device); runner: tpu-inference serves "
                "Qwen3-Next"]
    return []


def unserved_moe(hf_config: dict | None) -> list[str]:
    problems = []
    for arch in (hf_config or {}).get("architectures") or []:
        reason = UNSERVED_MOE_ARCHITECTURES.get(arch)
        if reason:
            where = WHERE_IT_STOPS[reason.partition(":")[0]]
            problems.append(f"model: vLLM 0.13's TPU runner cannot serve {arch}: {reason} ({where}); try runner: "
                            "tpu-inference (kernels of its own; configs/zoo-jax.yaml serves DeepSeek V3, GPT-OSS and "
                            "Llama 4 there)")
    return problems


def multimodal(entry, hf_config: dict | None) -> list[str]:
    """The plan covers the vision models whose image token count the config fixes (buckets.image_tokens), in
    steps that encode one image: vLLM 0.13's TPUModelRunner._execute_mm_encoder caches a step's batched encoder
    output (one [images, tokens, hidden] tensor) as its first image's alone, so the step's second image fails
    with "Encoder cache miss" and the engine core dies, on a TPU as on the twin. A step encodes at most
    max_num_batched_tokens // image tokens images (MultiModalBudget); TpuPlatform forces whole images, so vLLM
    itself refuses a budget below one image."""
    from .buckets import PLANNED_MULTIMODAL_ARCHITECTURES, image_tokens, is_multimodal

    architectures = set((hf_config or {}).get("architectures") or [])
    if not is_multimodal(hf_config):
        return []
    if not architectures & PLANNED_MULTIMODAL_ARCHITECTURES:
        return [f"model: the vllm-tpu plan covers the multimodal architectures "
                f"{', '.join(sorted(PLANNED_MULTIMODAL_ARCHITECTURES))} (images of one size after the processor), "
                f"not {', '.join(sorted(architectures)) or 'this config'}: its encoder's shapes depend on each "
                "request's images; runner: tpu-inference plans Qwen2.5-VL, Gemma 4, Llama Guard 4, LLaVA, and Qwen3-VL "
                "with its kin (Qwen3-VL MoE, Cosmos 3, Qwen3.5)"]
    per_image, budget = image_tokens(hf_config), entry.max_num_batched_tokens
    if budget < per_image:
        return [f"matrix.max_num_batched_tokens: {budget} is below one image's {per_image} tokens, which vLLM "
                "0.13's TPU platform schedules whole (disable_chunked_mm_input; vLLM refuses: "
                "compute_mm_encoder_budget)"]
    if entry.engine.get("enable_chunked_prefill") is not False:
        return ["engine.enable_chunked_prefill: vLLM 0.13 serves images on a TPU with chunked prefill off only: its "
                "scheduler splits an image that starts a step (the disable_chunked_mm_input rollback checks "
                "num_computed_tokens < start_pos) while the TPU runner merges whole images (_gather_mm_embeddings), "
                "so the step's masked_scatter fails to lower and the server dies: set enable_chunked_prefill: false "
                "(runner: tpu-inference serves LLaVA with chunked prefill)"]
    if budget >= 2 * per_image:
        return [f"matrix.max_num_batched_tokens: {budget} lets one step encode {budget // per_image} images; vLLM "
                "0.13's TPU runner keeps only the first of a step's encoder batch (TPUModelRunner._execute_mm_encoder "
                "caches the batched output as one item: the next image fails with 'Encoder cache miss' and the "
                f"server dies): use {per_image} to {2 * per_image - 1} (one image a step), or runner: tpu-inference"]
    return []
