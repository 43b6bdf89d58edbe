"""Gemma 4 vision on tpu-inference (its JAX `Gemma4ForConditionalGeneration`), as plain data: what a step with
images compiles, read from the entry and the model's config alone (no stack imported).

Gemma 4's image processor resizes every image to at most `max_soft_tokens x pooling_kernel_size**2` patches
(aspect kept) and pads its patches to exactly that many, so the encoder's shape follows the soft-token budget
an image is processed with, never the image: one graph per budget (`image_encoder {soft_tokens}`), and its
output has that many rows whatever the image (the rows `place_encoder_rows` copies from). The stack's warm-up
compiles none of it: `precompile_vision_encoder` runs only for `vision_warmup_config` and then hands 4-D
pixels to a patch embedder that takes 3-D patches (ValueError at start-up), so `check` refuses that setting.
"""

from __future__ import annotations


from aotc.graphs import GraphSpec
from aotc.entry import Entry
from aotc.runners.multimodal import image_step_graphs

ARCHITECTURE = "Gemma4ForConditionalGeneration"
# transformers' Gemma4ImageProcessor._SUPPORTED_SOFT_TOKENS (vLLM's processor refuses any other value)
SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)
DEFAULT_SOFT_TOKENS = 280  # Gemma4ImageProcessor.max_soft_tokens
# The image placeholder expands to begin-of-image, the soft tokens, end-of-image.
IMAGE_WRAPPER_TOKENS = 2
# Images a sweep and the canary send, [height, width]: square, wide and tall (each resized to its budget).
IMAGE_SHAPES = ([64, 64], [96, 160], [200, 72])


def is_gemma4_vision(hf_config: dict | None) -> bool:
    return ARCHITECTURE in ((hf_config or {}).get("architectures") or [])


def problems(entry: Entry) -> list[str]:
    """The encoder settings the stack cannot start with or the plan does not follow (buckets.plan_problems)."""
    if entry.engine_mapping("additional_config").get("vision_warmup_config"):
        return ["engine.additional_config: tpu-inference 0.32 cannot start Gemma 4 with vision_warmup_config: its "
                "precompile_vision_encoder hands 4-D pixels to a patch embedder that takes 3-D patches "
                "(ValueError at start-up); leave it out (aotc compiles the encoder per soft-token budget)"]
    if entry.engine_mapping("compilation_config").get("cudagraph_mm_encoder"):
        return ["engine.compilation_config: the tpu-inference plan covers Gemma 4's image encoder as the stack runs "
                "it by default, not through its encoder-budget manager (cudagraph_mm_encoder)"]
    return []


def processor_soft_tokens(entry: Entry, hf_config: dict) -> int:
    """The soft-token budget an image gets unless its request names another: mm_processor_kwargs' max_soft_tokens
    (top level or images_kwargs, as vLLM's _get_max_soft_tokens reads them), else the model's
    processor_config.json, else the vision config's default_output_length."""
    kwargs = entry.engine.get("mm_processor_kwargs") or {}
    value = kwargs.get("max_soft_tokens") or (kwargs.get("images_kwargs") or {}).get("max_soft_tokens")
    if value is None:
        value = (entry.model_json("processor_config.json").get("image_processor") or {}).get("max_soft_tokens")
    if value is None:
        value = hf_config["vision_config"].get("default_output_length", DEFAULT_SOFT_TOKENS)
    return int(value)


def soft_token_budgets(entry: Entry, hf_config: dict) -> list[int]:
    """The budgets a request may process an image with (its mm_processor_kwargs max_soft_tokens, which vLLM
    accepts only with trust_request_mm_kwargs): every supported value up to the entry's own (vLLM sizes its
    encoder budget for that one) whose image fits max_model_len."""
    largest = processor_soft_tokens(entry, hf_config)
    return [n for n in SUPPORTED_SOFT_TOKENS
            if n <= largest and n + IMAGE_WRAPPER_TOKENS < entry.max_model_len]


def step_graphs(entry: Entry, hf_config: dict, tokens: list[int]) -> list[GraphSpec]:
    """Beyond the warm-up: the encoder per soft-token budget (get_single_image_embedding and the row of the
    batch it hands back); per token bucket the step's placeholder mask, its empty embedding buffer and, per
    budget, the copy of an image's encoder rows (aotc's serving fixes)."""
    budgets = soft_token_budgets(entry, hf_config)
    encoders = [GraphSpec.of("image_encoder", True, soft_tokens=n) for n in budgets]
    return encoders + image_step_graphs(tokens, [{"encoder_rows": n} for n in budgets])


def traffic_images(entry: Entry, hf_config: dict) -> tuple[tuple[int, int, int], ...]:
    """(height, width, prompt tokens at most) of the images a sweep sends: IMAGE_SHAPES at the entry's budget."""
    tokens = processor_soft_tokens(entry, hf_config) + IMAGE_WRAPPER_TOKENS
    return tuple((h, w, tokens) for h, w in IMAGE_SHAPES)
