"""Qwen3-VL and its kin on tpu-inference (vLLM's `Qwen3VLForConditionalGeneration` and its subclasses through
torchax: Qwen3-VL MoE, Cosmos 3, Qwen3.5 dense and MoE), as plain data: what a step with images compiles, read from
the entry and the model's config alone (no stack imported). They differ in their text model (MoE experts run
through the stack's fused MoE, Qwen3.5's linear-attention layers through its GDN kernel) and in deepstack levels.

Served with `compilation_config.cudagraph_mm_encoder`, the stack runs the vision tower through its
MMEncoderJITManager (a subclass of vLLM's EncoderCudaGraphManager): the images of an encoder batch are packed
into the smallest token budget that holds them, their inputs built on the host and padded to the budget's
template, and one jitted tower runs per budget (`mm_encoder_jit`, which its warm-up compiles). Its output has
the budget's rows, the image tokens followed by its deepstack levels along the width. Without that setting
the stack jits the tower per image grid (vision_tower_jit, GridTHW static): `check` refuses it.
"""

from __future__ import annotations

from aotc.graphs import GraphSpec
from aotc.entry import Entry
from aotc.runners.multimodal import image_step_graphs

ARCHITECTURE = "Qwen3VLForConditionalGeneration"
# the architectures that take this path: Qwen3-VL and the subclasses of its vLLM model that define none of its
# methods anew, changing the text model or the weight names only (the stack's qwen3_vl_patcher and its budget
# range apply to them as to Qwen3-VL) ...
SAME_METHODS_ARCHITECTURES = frozenset({ARCHITECTURE, "Qwen3VLMoeForConditionalGeneration",
                                        "Cosmos3ForConditionalGeneration"})
# ... and Qwen3.5 (dense and MoE), whose embed_input_ids and forward are its own: vLLM's merge (its tower has no
# deepstack levels; with the empty deepstack_visual_indexes its checkpoints ship, the stack's Qwen3-VL patches wrap
# them, packing none), then its hybrid text model
OWN_EMBEDDING_ARCHITECTURES = frozenset({"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"})
ARCHITECTURES = SAME_METHODS_ARCHITECTURES | OWN_EMBEDDING_ARCHITECTURES
# Qwen3VLForConditionalGeneration.get_encoder_cudagraph_budget_range: its smallest budget (a 224 x 224 image's
# tokens); the largest is min(max_num_batched_tokens, max_model_len)
MIN_BUDGET = 64


def is_qwen3_vl(hf_config: dict | None) -> bool:
    return bool(ARCHITECTURES.intersection((hf_config or {}).get("architectures") or []))


def problems(entry: Entry, largest_image_tokens: int | None) -> list[str]:
    """What would compile per image while serving, or the plan does not follow (buckets.plan_problems)."""
    compilation = entry.engine_mapping("compilation_config")
    if not compilation.get("cudagraph_mm_encoder"):
        return ["engine.compilation_config: tpu-inference 0.32 serves Qwen3-VL with its vision tower jitted per "
                "image grid (GridTHW static) unless compilation_config.cudagraph_mm_encoder is set: every new image "
                "size compiles while serving; set it (the tower then runs per token budget)"]
    limits = entry.engine.get("limit_mm_per_prompt") or {}
    if limits.get("video", 1):
        return ["engine.limit_mm_per_prompt: the tpu-inference plan covers Qwen3-VL's images, not video: set "
                "limit_mm_per_prompt video: 0"]
    if compilation.get("encoder_cudagraph_max_vision_items_per_batch") or compilation.get("encoder_cudagraph_"
                                                                                            "token_budgets"):
        return ["engine.compilation_config: the tpu-inference plan takes Qwen3-VL's encoder budgets as vLLM derives "
                "them, not encoder_cudagraph_token_budgets or encoder_cudagraph_max_vision_items_per_batch"]
    if largest_image_tokens is None:
        return ["model: the plan needs Qwen3-VL's largest image (its preprocessor_config.json size.longest_edge, or "
                "mm_processor_kwargs): images above the largest encoder budget run the tower eagerly, compiling "
                "per image"]
    largest_budget = budgets(entry)[-1]
    if largest_image_tokens > largest_budget:
        return [f"matrix.max_num_batched_tokens: an image can take {largest_image_tokens} tokens, more than the "
                f"largest encoder budget ({largest_budget}, min(max_num_batched_tokens, max_model_len)): tpu-inference "
                "runs such an image's tower eagerly, compiling per image size; bound the images (mm_processor_kwargs "
                "size.longest_edge) or raise max_num_batched_tokens"]
    return []


def budgets(entry: Entry) -> list[int]:
    """EncoderCudaGraphManager._generate_budgets over the model's budget range: powers of two from MIN_BUDGET,
    and the largest."""
    largest = min(entry.max_num_batched_tokens, entry.max_model_len)
    out, budget = [], MIN_BUDGET
    while budget <= largest:
        out.append(budget)
        budget *= 2
    if not out or out[-1] < largest:
        out.append(largest)
    return out


def warmup_graphs(entry: Entry) -> list[GraphSpec]:
    """MMEncoderJITManager.precompile_vision_encoder: the tower once per budget."""
    return [GraphSpec.of("mm_encoder_jit", budget=b) for b in budgets(entry)]


def step_graphs(entry: Entry, tokens: list[int]) -> list[GraphSpec]:
    """Beyond the warm-up: the image-step families, an encoder output being a budget's rows (aotc's serving fixes
    keep it whole)."""
    return image_step_graphs(tokens, [{"encoder_rows": b} for b in budgets(entry)])
