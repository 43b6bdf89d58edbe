"""Runs in a process of its own (tests/vllm_tpu/test_matrix_rules.py): builds every MoE model of vLLM 0.13's text
registry as its TPU runner would, on the twin's platform (a TpuPlatform), and says what stops each.

Each model's config is transformers' own class for it (its defaults: the layout the architecture ships), shrunk
to 2 layers of width 64; the model is built on the meta device, so nothing is allocated or loaded. What stops a
model on vLLM 0.13's TPU runner shows up here: its attention backend (PallasAttentionBackendImpl) is built in
the model's constructor, and UnquantizedFusedMoEMethod.forward_tpu's refusals are fields of the FusedMoE
layers the constructor makes.

stdout (last line): {architecture: "serves" | the stack's reason (rules.UNSERVED_ARCHITECTURES' words) |
"config: ..." (transformers' class lacks a field vLLM's model reads: not a TPU fact, left to the build)}
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import tempfile
import traceback

import torch
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from vllm.config import LoadConfig, ModelConfig, VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.layers.fused_moe import FusedMoE
from vllm.model_executor.model_loader.utils import get_model_architecture
from vllm.model_executor.models.interfaces import is_attention_free, is_hybrid
from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS
from vllm.platforms import current_platform

SHRINK = {
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
    "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "num_experts": 8, "num_local_experts": 8,
    "n_routed_experts": 8, "moe_num_experts": 8, "num_experts_per_tok": 2, "moe_k": 2, "n_shared_experts": 1,
    "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1, "q_lora_rank": 32, "kv_lora_rank": 32,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16,
}
# fields some of vLLM's models read although transformers' class may leave them None
ALWAYS_SET = ("head_dim", "moe_intermediate_size")
ATTENTION_KEYWORDS = {"q_lora_rank": "MLA attention", "sinks": "attention sinks"}


def moe_architectures() -> list[str]:
    """Those whose module builds a FusedMoE, less the ones with mamba-type layers (rules.STATEFUL_ARCHITECTURES
    refuses them first)."""
    found = []
    for arch, (module_name, class_name) in sorted(_TEXT_GENERATION_MODELS.items()):
        try:
            module = importlib.import_module(f"vllm.model_executor.models.{module_name}")
        except ImportError:  # a model whose package this install lacks: no server starts with it
            continue
        model_class = getattr(module, class_name)
        if re.search(r"\b(Shared)?FusedMoE\(", inspect.getsource(module)) and not (
                is_hybrid(model_class) or is_attention_free(model_class)):
            found.append(arch)
    return found


def tiny_config_dir(model_type: str, arch: str) -> str:
    config = CONFIG_MAPPING[model_type]()
    for key, value in SHRINK.items():
        if hasattr(config, key) or key in ALWAYS_SET and getattr(config, key, None) is None:
            setattr(config, key, value)
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[: SHRINK["num_hidden_layers"]]
    config.architectures = [arch]
    config.dtype = "bfloat16"  # stated, as a shipped config does: vLLM looks for the weights' dtype otherwise
    path = tempfile.mkdtemp()
    config.save_pretrained(path)
    return path


def forward_tpu_refusals(layer: FusedMoE) -> list[str]:
    """The fields UnquantizedFusedMoEMethod.forward_tpu asserts or raises on, in its own order."""
    checks = [
        (layer.use_grouped_topk, "grouped top-k"),
        (layer.custom_routing_function is not None, "custom routing function"),
        (layer.apply_router_weight_on_input, "router weight on input"),
        (layer.scoring_func != "softmax", f"{layer.scoring_func} scoring"),
        (layer.e_score_correction_bias is not None, "score-correction bias"),
        (layer.activation != "silu", f"{layer.activation} activation"),
        (layer.routed_scaling_factor != 1.0, "routed scaling factor"),
    ]
    return [name for failed, name in checks if failed]


def construction_failure(error: Exception) -> str:
    frames = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
    if isinstance(error, TypeError) and "PallasAttentionBackendImpl.__init__()" in str(error):
        keyword = re.search(r"keyword argument '(\w+)'", str(error)).group(1)
        return ATTENTION_KEYWORDS.get(keyword, f"attention argument {keyword}")
    if isinstance(error, NotImplementedError) and "create_chunked_local_attention_backend" in frames:
        return "chunked local attention"
    if isinstance(error, AttributeError) and "Config' object has no attribute" in str(error):
        return f"config: {error}"
    raise error


def tiny_vllm_config(arch: str, model_type: str) -> VllmConfig:
    model_config = ModelConfig(model=tiny_config_dir(model_type, arch), dtype="bfloat16", max_model_len=128,
                               skip_tokenizer_init=True)
    return VllmConfig(model_config=model_config, load_config=LoadConfig(load_format="dummy"))


def verdict(vllm_config: VllmConfig) -> str:
    model_class, _ = get_model_architecture(vllm_config.model_config)
    try:
        with set_current_vllm_config(vllm_config), torch.device("meta"):
            model = model_class(vllm_config=vllm_config, prefix="")
    except Exception as error:  # noqa: BLE001 - classified, or raised again
        return construction_failure(error)
    layers = [module for module in model.modules() if isinstance(module, FusedMoE)]
    refusals = sorted({name for layer in layers for name in forward_tpu_refusals(layer)})
    return f"MoE routing: {', '.join(refusals)}" if refusals else "serves"


def main() -> dict[str, str]:
    assert type(current_platform).__mro__[1].__name__ == "TpuPlatform", type(current_platform)
    model_types = {cls.lower(): model_type for model_type, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()}
    configs = {arch: tiny_vllm_config(arch, model_types[arch.lower()])
               for arch in moe_architectures() if arch.lower() in model_types}
    with set_current_vllm_config(next(iter(configs.values()))):  # one rank, as a TP-1 worker is
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tempfile.mktemp()}")
        initialize_model_parallel(1, 1)
    return {arch: verdict(config) for arch, config in configs.items()}


if __name__ == "__main__":
    print(json.dumps(main(), sort_keys=True))
