"""vllm-tpu 0.32 / tpu-inference 0.32's own checks on an entry (RunnerSpec.validate): the front end's rules
plus tpu-inference's TpuPlatform's. Held against their code by tests/tpu_inference/test_plan_jax.py."""

from __future__ import annotations

from aotc.runners import vllm_rules

# tpu_inference.platforms.tpu_platform.TpuPlatform.supported_quantization
QUANTIZATIONS = ("compressed-tensors", "auto_awq", "fp8", "gpt_oss_mxfp4", "modelopt_fp4", "deepseek_v4_fp8",
                 "unquantized")  # the last appended at import by vllm.model_executor.layers.quantization


def validate(entry, hf_config: dict | None) -> list[str]:
    # CacheConfig.block_size is any positive int in vLLM 0.32 (the schema's minimum of 1 already says so)
    return (vllm_rules.common(entry, hf_config) + vllm_rules.quantization(entry, QUANTIZATIONS, "TpuPlatform")
            + untied_jax_qwen2(entry, hf_config))


def untied_jax_qwen2(entry, hf_config: dict | None) -> list[str]:
    """tpu-inference 0.32's JAX Qwen2ForCausalLM sizes an untied lm_head with getattr(hf_config, "hidden_size",
    hf_config.text_config.hidden_size): Python evaluates the default first, a Qwen2 config has no text_config,
    so the model fails at construction (AttributeError) whenever tie_word_embeddings is false, as for Qwen2.5
    7B and up. vLLM's own Qwen2 (MODEL_IMPL_TYPE=vllm, through torchax) builds it."""
    if not hf_config or "Qwen2ForCausalLM" not in (hf_config.get("architectures") or []):
        return []
    if str(entry.env.get("MODEL_IMPL_TYPE", "auto")).lower() not in ("auto", "flax_nnx") or entry.engine.get("enable_lora"):
        return []  # vLLM's model (LoRA implies it)
    if hf_config.get("tie_word_embeddings", False) or "text_config" in hf_config:
        return []
    return ["env.MODEL_IMPL_TYPE: tpu-inference 0.32's JAX Qwen2ForCausalLM cannot build an untied lm_head (it reads "
            "hf_config.text_config.hidden_size, which a Qwen2 config lacks: AttributeError at start-up); set "
            "MODEL_IMPL_TYPE: vllm (vLLM's Qwen2 through torchax)"]
