"""A random PEFT LoRA adapter shaped for a model's config, for entries with ``enable_lora``.

A LoRA graph depends on the engine's ``max_loras`` / ``max_lora_rank`` and the model's shapes, never on an
adapter's values or its own rank (vLLM pads every adapter to ``max_lora_rank``), so the build's and verify's
traffic, and the canary when the matrix names no adapter, use one written here: numpy and safetensors only,
seeded, nothing from a hub.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The adapter's name in requests and on the stock server's --lora-modules.
ADAPTER_NAME = "aotc-lora"
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def projection_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each Llama-style projection from a config.json's fields."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads") or heads
    inter = config["intermediate_size"]
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv * head_dim),
            "v_proj": (hidden, kv * head_dim), "o_proj": (heads * head_dim, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


def write_adapter(out: str | Path, config: dict[str, Any], rank: int = 8, seed: int = 0,
                  targets: tuple[str, ...] = ATTENTION) -> Path:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` (float16) into ``out``."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    shapes = projection_shapes(config)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for name in targets:
            n_in, n_out = shapes[name]
            part = "self_attn" if name in ATTENTION else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((rank, n_in)) * 0.02).astype(np.float16)
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((n_out, rank)) * 0.02).astype(np.float16)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    adapter_config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
                      "lora_dropout": 0.0, "bias": "none", "target_modules": list(targets),
                      "fan_in_fan_out": False, "base_model_name_or_path": None, "modules_to_save": None,
                      "use_rslora": False, "use_dora": False}
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
    return out
