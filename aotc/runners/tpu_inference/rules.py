"""vllm-tpu 0.32 / tpu-inference 0.32's own checks on an entry (RunnerSpec.validate): the front end's rules
plus tpu-inference's TpuPlatform's. Held against their code by tests/tpu_inference/test_plan_jax.py."""

from __future__ import annotations

from aotc.runners import vllm_rules

# tpu_inference.platforms.tpu_platform.TpuPlatform.supported_quantization
QUANTIZATIONS = ("compressed-tensors", "auto_awq", "fp8", "gpt_oss_mxfp4", "modelopt_fp4", "deepseek_v4_fp8",
                 "unquantized")  # the last appended at import by vllm.model_executor.layers.quantization


def validate(entry, hf_config: dict | None) -> list[str]:
    # CacheConfig.block_size is any positive int in vLLM 0.32 (the schema's minimum of 1 already says so)
    return vllm_rules.common(entry, hf_config) + vllm_rules.quantization(entry, QUANTIZATIONS, "TpuPlatform")
