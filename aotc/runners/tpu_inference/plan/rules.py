"""vllm-tpu 0.32 / tpu-inference 0.32's own checks on an entry (RunnerSpec.validate): the front end's rules
plus tpu-inference's TpuPlatform's. Held against their code by tests/tpu_inference/test_plan_jax.py."""

from __future__ import annotations

from aotc.runners import vllm_rules
from aotc.runners.tpu_inference.plan.block_size import uses_mla
from aotc.runners.tpu_inference.plan.buckets import DRAFTER_METHODS, additional_config, plan_problems, speculative_config

# tpu_inference.platforms.tpu_platform.TpuPlatform.supported_quantization
QUANTIZATIONS = ("compressed-tensors", "auto_awq", "fp8", "gpt_oss_mxfp4", "modelopt_fp4", "deepseek_v4_fp8",
                 "unquantized")  # the last appended at import by vllm.model_executor.layers.quantization


def validate(entry, hf_config: dict | None) -> list[str]:
    # CacheConfig.block_size is any positive int in vLLM 0.32 (the schema's minimum of 1 already says so)
    return (vllm_rules.common(entry, hf_config) + vllm_rules.quantization(entry, QUANTIZATIONS, "TpuPlatform")
            + untied_jax_qwen2(entry, hf_config) + mla_settings(entry, hf_config)
            + dflash_untied_target(entry, hf_config) + jax_deepseek_v3(entry, hf_config)
            + draft_implementation(entry, hf_config) + plan_problems(entry, hf_config))


def on_jax_path(entry) -> bool:
    """The model runs as tpu-inference's own JAX model (MODEL_IMPL_TYPE auto or flax_nnx; LoRA implies vLLM's)."""
    return (str(entry.env.get("MODEL_IMPL_TYPE", "auto")).lower() in ("auto", "flax_nnx")
            and not entry.engine.get("enable_lora"))


def untied_jax_qwen2(entry, hf_config: dict | None) -> list[str]:
    """tpu-inference 0.32's JAX Qwen2ForCausalLM sizes an untied lm_head with getattr(hf_config, "hidden_size",
    hf_config.text_config.hidden_size): Python evaluates the default first, a Qwen2 config has no text_config,
    so the model fails at construction (AttributeError) whenever tie_word_embeddings is false, as for Qwen2.5
    7B and up. vLLM's own Qwen2 (MODEL_IMPL_TYPE=vllm, through torchax) builds it."""
    if not hf_config or "Qwen2ForCausalLM" not in (hf_config.get("architectures") or []):
        return []
    if not on_jax_path(entry):
        return []
    if hf_config.get("tie_word_embeddings", False) or "text_config" in hf_config:
        return []
    return ["env.MODEL_IMPL_TYPE: tpu-inference 0.32's JAX Qwen2ForCausalLM cannot build an untied lm_head (it reads "
            "hf_config.text_config.hidden_size, which a Qwen2 config lacks: AttributeError at start-up); set "
            "MODEL_IMPL_TYPE: vllm (vLLM's Qwen2 through torchax)"]


def mla_settings(entry, hf_config: dict | None) -> list[str]:
    """TpuPlatform.check_and_update_config refuses an MLA model (DeepSeek V2/V3, Kimi K2, ...) unless both
    NEW_MODEL_DESIGN=1 and DP attention are set: the server never starts otherwise."""
    if not uses_mla(hf_config):
        return []
    new_model_design = bool(int(entry.env.get("NEW_MODEL_DESIGN") or 0))
    sharding = (additional_config(entry).get("sharding") or {}).get("sharding_strategy") or {}
    if new_model_design and sharding.get("enable_dp_attention"):
        return []
    key = "engine.additional_config" if new_model_design else "env.NEW_MODEL_DESIGN"
    return [f"{key}: tpu-inference 0.32 refuses an MLA model unless NEW_MODEL_DESIGN: 1 is set and additional_config "
            "has {sharding: {sharding_strategy: {enable_dp_attention: true}}} (TpuPlatform.check_and_update_config)"]


# JAX models whose untied lm_head is a module (JaxLmHead) at the top of their state, with their config's default
# tie_word_embeddings (transformers' Qwen3Config, Gemma4Config)
JAX_HEAD_MODULE_TIED_BY_DEFAULT = {"Qwen3ForCausalLM": False, "Gemma4ForCausalLM": True}


def dflash_untied_target(entry, hf_config: dict | None) -> list[str]:
    """tpu-inference 0.32's DFlashProposer.load_model shares the target's lm_head by taking the first of
    TARGET_LM_HEAD_PATHS its state has, and reads `.value`: for a JAX Qwen3 or Gemma 4 with untied embeddings
    (Qwen3 8B and up) that is "lm_head", the head module, not a parameter, and the server dies at start-up
    (AttributeError: No attribute 'value' in State). A tied target (Qwen3 up to 4B) shares its embedding."""
    method = (speculative_config(entry) or {}).get("method")
    architectures = (hf_config or {}).get("architectures") or []
    head_module = [a for a in architectures if a in JAX_HEAD_MODULE_TIED_BY_DEFAULT]
    if method != "dflash" or not head_module or not on_jax_path(entry):
        return []
    if hf_config.get("tie_word_embeddings", JAX_HEAD_MODULE_TIED_BY_DEFAULT[head_module[0]]):
        return []
    return [f"engine.speculative_config: tpu-inference 0.32's DFlash drafter cannot share the lm_head of an untied "
            f"JAX {head_module[0]} (DFlashProposer.load_model reads .value of the target's lm_head module: "
            "AttributeError at start-up); a DFlash target on its JAX path needs tie_word_embeddings true"]


# tpu-inference 0.32's JAX DeepSeek V3 (models/jax/deepseek_v3.py) reads every size but the layer count from its
# module constants, DeepSeek V3's: constant -> (the config key it stands for, its value). The router's group
# top-k is a literal 4 there (topk_groups=4), listed under None.
JAX_DEEPSEEK_V3_CONSTANTS = {
    "num_local_experts": ("n_routed_experts", 256), "vocab_size": ("vocab_size", 129280),
    "hidden_size": ("hidden_size", 7168), "num_attention_heads": ("num_attention_heads", 128),
    "num_key_value_heads": ("num_key_value_heads", 128), "ffw_intermediate_size": ("intermediate_size", 18432),
    "moe_intermediate_size": ("moe_intermediate_size", 2048), "num_experts_per_token": ("num_experts_per_tok", 8),
    "n_group": ("n_group", 8), "interleave_moe_layer_step": ("moe_layer_freq", 1), "hidden_act": ("hidden_act", "silu"),
    "rms_norm_eps": ("rms_norm_eps", 1e-06), "routed_scaling_factor": ("routed_scaling_factor", 2.5),
    "first_k_dense_replace": ("first_k_dense_replace", 3), "num_shared_experts": ("n_shared_experts", 1),
    "rope_theta": ("rope_theta", 10000),
    "rope_scaling": ("rope_scaling", {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                      "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                      "type": "yarn"}),
    "q_lora_rank": ("q_lora_rank", 1536), "kv_lora_rank": ("kv_lora_rank", 512),
    "qk_nope_head_dim": ("qk_nope_head_dim", 128), "qk_rope_head_dim": ("qk_rope_head_dim", 64),
    "v_head_dim": ("v_head_dim", 128), None: ("topk_group", 4),
}


def deepseek_config_value(config, key: str):
    """`key` of a DeepSeek V3 config (config.json as a dict, or transformers' config object, which keeps
    rope_theta in rope_parameters)."""
    value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
    if value is None and key == "rope_theta":
        return deepseek_config_value(config, "rope_parameters")["rope_theta"]
    return value


def _differs(value, expected) -> bool:
    if isinstance(expected, dict):  # transformers adds keys of its own to rope_scaling
        return not isinstance(value, dict) or any(value.get(k) != v for k, v in expected.items())
    return value != expected


def jax_deepseek_v3(entry, hf_config: dict | None) -> list[str]:
    """tpu-inference 0.32's JAX DeepseekV3ForCausalLM, the default for that architecture, serves only:
    * an FP8 checkpoint: its MLAEinsum dequantizes kv_b_proj at load and asserts a quantization config;
    * DeepSeek V3's sizes (V3, R1, V3.1), its module constants: a checkpoint of other sizes (Kimi K2,
      DeepSeek V2) fails to load. The CPU twin builds the model at its config's sizes (twin.deepseek), so this
      holds for `device: tpu` only; the router's literal group top-k (4) holds everywhere.
    vLLM's DeepseekV3 through torchax (MODEL_IMPL_TYPE: vllm) takes any of them."""
    if "DeepseekV3ForCausalLM" not in ((hf_config or {}).get("architectures") or []) or not on_jax_path(entry):
        return []
    reasons = []
    if not hf_config.get("quantization_config") and not entry.engine.get("quantization"):
        reasons.append("an FP8 checkpoint (its MLAEinsum asserts a quantization config)")
    checked = (JAX_DEEPSEEK_V3_CONSTANTS.items() if entry.device == "tpu"
               else [(None, JAX_DEEPSEEK_V3_CONSTANTS[None])])
    found = {key: deepseek_config_value(hf_config, key) for _, (key, _) in checked}
    differing = [f"{key} {found[key]!r} (not {value!r})" for _, (key, value) in checked if _differs(found[key], value)]
    if differing:
        reasons.append("DeepSeek V3's sizes, fixed in its code: " + ", ".join(differing))
    if not reasons:
        return []
    return ["env.MODEL_IMPL_TYPE: tpu-inference 0.32's JAX DeepseekV3ForCausalLM serves only " + "; and ".join(reasons)
            + "; set MODEL_IMPL_TYPE: vllm (vLLM's DeepseekV3 through torchax)"]


# tpu_inference.models.common.model_loader._VLLM_PREFERRED_ARCHITECTURES: MODEL_IMPL_TYPE auto resolves these to
# vLLM's model (torchax), any other architecture to flax_nnx (which falls back to vLLM's model at load when the
# stack has no JAX one, but still counts as flax_nnx below).
VLLM_PREFERRED_ARCHITECTURES = frozenset({"GptOssForCausalLM", "Qwen3MoeForCausalLM", "KimiK25ForConditionalGeneration",
                                          "Qwen3_5MoeForConditionalGeneration"})


def resolved_implementation(setting: str | None, architecture: str) -> str:
    """model_loader.resolve_model_impl_type: the variable's value, or for auto the architecture's default."""
    setting = str(setting or "auto").lower()
    if setting != "auto":
        return setting
    return "vllm" if architecture in VLLM_PREFERRED_ARCHITECTURES else "flax_nnx"


def draft_implementation(entry, hf_config: dict | None) -> list[str]:
    """tpu-inference 0.32's drafters (Eagle3Proposer, DFlashProposer: load_model) raise a ValueError at start-up
    unless MODEL_IMPL_TYPE and DRAFT_MODEL_IMPL_TYPE resolve alike. No draft architecture vLLM names (an MTP
    head, EAGLE-3, DFlash, Gemma 4's assistant) is a preferred one, so under auto a draft resolves to flax_nnx,
    and a target the stack prefers on vLLM's model (Qwen3.5 MoE with its MTP layers) fails at start-up unless
    the draft is set to vllm too."""
    method = (speculative_config(entry) or {}).get("method")
    if method not in DRAFTER_METHODS or not hf_config:
        return []
    env = entry.backend.runner_env(entry, environ={})  # the matrix's values, else the implied ones (LoRA: vllm)
    architecture = (hf_config.get("architectures") or [""])[0]
    target = resolved_implementation(env.get("MODEL_IMPL_TYPE"), architecture)
    draft = resolved_implementation(env.get("DRAFT_MODEL_IMPL_TYPE"), "")  # no draft name is a preferred one
    if target == draft:
        return []
    return [f"env.DRAFT_MODEL_IMPL_TYPE: tpu-inference 0.32 runs a draft only on its target's implementation "
            f"(its drafter's load_model raises otherwise: 'The implementation of the draft model must be the same "
            f"as the target model'); "
            f"{architecture} resolves to {target}, the draft to {draft}; set DRAFT_MODEL_IMPL_TYPE: {target}"]
