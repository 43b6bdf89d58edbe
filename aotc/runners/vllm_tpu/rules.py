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
    return problems + vllm_rules.quantization(entry, QUANTIZATIONS, "TpuPlatform")
