"""vLLM 0.13's own checks on an entry (RunnerSpec.validate): the front end's rules plus TpuPlatform's.
Held against vLLM's code by tests/test_matrix_rules.py."""

from __future__ import annotations

from aotc.runners import vllm_rules

BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # vllm.config.cache.BlockSize: `vllm serve --block-size` choices
QUANTIZATIONS = ("fp8", "tpu_int8", "compressed-tensors")  # vllm.platforms.tpu.TpuPlatform.supported_quantization


def validate(entry, hf_config: dict | None) -> list[str]:
    problems = vllm_rules.common(entry, hf_config)
    block = entry.engine.get("block_size")
    if block is not None and block not in BLOCK_SIZES:
        problems.append(f"engine.block_size: {block} is not one of {list(BLOCK_SIZES)} (vllm serve --block-size choices, CacheConfig.BlockSize)")
    return problems + vllm_rules.quantization(entry, QUANTIZATIONS, "TpuPlatform") + lora(entry)


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
