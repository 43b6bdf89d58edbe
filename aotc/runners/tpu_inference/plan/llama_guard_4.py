"""Llama Guard 4 on tpu-inference (its JAX `LlamaGuard4ForCausalLM`, served for `Llama4ForConditionalGeneration`),
as plain data: what a step with images compiles, read from the entry and the model's config alone (no stack
imported).

vLLM's Llama 4 processor cuts an image into tiles of `vision_config.image_size` pixels a side: the canvas of at
most `max_patches` tiles that fits it best, plus one global tile when the canvas has more than one. An image is
therefore 1, or 3 to max_patches + 1, tiles, and the vision tower's shape follows that count only, never the
image. The stack runs the tower eagerly over a batch's tiles (an XLA compile per op and per tile total); under
aotc's serving fixes each image goes through the stack's own jitted `_compute_vision_features_jit` alone, so a
server compiles one encoder per tile count (`image_encoder {image_tiles}`), whose output has `image_tiles x
tokens_per_tile` rows (the rows `place_encoder_rows` copies from). The stack's warm-up (precompile_vision_encoder)
compiles that function at one tile for each `vision_warmup_config` image shape: the tower takes tile-sized
images only, so `check` refuses other shapes.
"""

from __future__ import annotations


from aotc.graphs import GraphSpec
from aotc.entry import Entry
from aotc.runners.multimodal import image_step_graphs

ARCHITECTURE = "Llama4ForConditionalGeneration"
DEFAULT_MAX_TILES = 16  # transformers' Llama4ImageProcessor.max_patches
# Llama4Processor._prompt_split_image: an image of n tiles takes n x (tokens_per_tile + 1) + 2 prompt tokens
# (begin and end of image, a separator after each canvas tile and the global tile's marker, or the single
# tile's marker).
IMAGE_WRAPPER_TOKENS = 2


def is_llama_guard_4(hf_config: dict | None) -> bool:
    return ARCHITECTURE in ((hf_config or {}).get("architectures") or [])


def warmup_shapes(entry: Entry) -> list:
    """additional_config.vision_warmup_config.image_shapes, [height, width] each ([] unset)."""
    return (entry.engine_mapping("additional_config").get("vision_warmup_config") or {}).get("image_shapes") or []


def problems(entry: Entry, hf_config: dict) -> list[str]:
    """Warm-up shapes its tower cannot run (buckets.plan_problems)."""
    tile = hf_config["vision_config"]["image_size"]
    if any(list(shape) != [tile, tile] for shape in warmup_shapes(entry)):
        return [f"engine.additional_config: Llama Guard 4's vision warm-up (precompile_vision_encoder) runs one "
                f"image of each vision_warmup_config shape through a tower sized for {tile} x {tile} tiles; "
                f"give [{tile}, {tile}] or leave it out (aotc compiles the encoder per tile count)"]
    return []


def tokens_per_tile(hf_config: dict) -> int:
    """Mllama4ProcessingInfo.get_patch_per_chunk: a tile's patches after the pixel shuffle."""
    vision = hf_config["vision_config"]
    return (vision["image_size"] // vision["patch_size"]) ** 2 // round(1 / vision["pixel_shuffle_ratio"] ** 2)


def max_tiles(entry: Entry) -> int:
    """The processor's max_patches: the engine's mm_processor_kwargs (vLLM hands them to the processor), else the
    model's preprocessor_config.json, else transformers' default."""
    value = (entry.engine.get("mm_processor_kwargs") or {}).get("max_patches")
    if value is None:
        value = entry.model_json("preprocessor_config.json").get("max_patches")
    return int(value if value is not None else DEFAULT_MAX_TILES)


def tile_counts(entry: Entry, hf_config: dict) -> list[int]:
    """The tile counts an image can have (one tile, or a canvas of 2 to max_patches tiles and the global one)
    whose prompt fits max_model_len."""
    per_tile = tokens_per_tile(hf_config)
    counts = [1, *range(3, max_tiles(entry) + 2)]
    return [n for n in counts if prompt_tokens(n, per_tile) <= entry.max_model_len]


def prompt_tokens(tiles: int, per_tile: int) -> int:
    return tiles * (per_tile + 1) + IMAGE_WRAPPER_TOKENS


def warmup_graphs(entry: Entry) -> list[GraphSpec]:
    """precompile_vision_encoder: the stack's jitted tower at one tile, named without a shape (as it logs it)."""
    return [GraphSpec.of("vision_encoder_projector")] if warmup_shapes(entry) else []


def step_graphs(entry: Entry, hf_config: dict, tokens: list[int]) -> list[GraphSpec]:
    """Beyond the warm-up: the encoder per tile count; per token bucket the step's placeholder mask, its empty
    embedding buffer and, per tile count, the copy of an image's encoder rows (aotc's serving fixes)."""
    counts, per_tile = tile_counts(entry, hf_config), tokens_per_tile(hf_config)
    encoders = [GraphSpec.of("image_encoder", True, image_tiles=n) for n in counts]
    return encoders + image_step_graphs(tokens, [{"encoder_rows": n * per_tile} for n in counts])


def traffic_images(entry: Entry, hf_config: dict) -> tuple[tuple[int, int, int], ...]:
    """(height, width, prompt tokens) of the images a sweep sends: one of each tile count, a row of
    tiles (a canvas of 1 x k tiles fits an image of exactly that size best)."""
    tile, per_tile = hf_config["vision_config"]["image_size"], tokens_per_tile(hf_config)
    return tuple((tile, tile * (1 if n == 1 else n - 1), prompt_tokens(n, per_tile))
                 for n in tile_counts(entry, hf_config))
