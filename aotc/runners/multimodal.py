"""What both stacks ask of a vision-language entry, read from its config alone (no stack imported)."""

from __future__ import annotations

import dataclasses
from typing import Any

from aotc.entry import Entry, hf_config
from aotc.graphs import GraphSpec
from aotc.runners.traffic import Limits


def is_multimodal(config: dict | None) -> bool:
    return bool(config) and any(k in config for k in ("vision_config", "audio_config"))


def entry_is_multimodal(entry: Entry) -> bool:
    return is_multimodal(hf_config(entry))


def images_per_prompt(entry: Entry) -> int:
    """At most two images a prompt, within the engine's limit_mm_per_prompt (vLLM's default: one)."""
    limit = (entry.engine.get("limit_mm_per_prompt") or {}).get("image", 1)
    return max(1, min(2, int(limit)))


# hf_config fields naming a vision-language model's special tokens (Qwen2.5-VL's; LLaVA's image token; Gemma 4's
# begin and end of image and audio)
IMAGE_TOKEN_FIELDS = ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id",
                      "image_token_index", "boi_token_id", "eoi_token_id", "audio_token_id", "boa_token_id",
                      "boi_token_index")
# Llama 4's image placeholder, which its processor expands to the image's tiles (its config names the patch
# token only, image_token_index, where the tiles' embeddings go)
LLAMA4_IMAGE_PLACEHOLDER = "<|image|>"


def text_vocab_size(llm) -> int:
    """Ids random prompts may use: the model's vocabulary up to its first image special token (an image
    placeholder without its image would fail the request)."""
    hf_config = llm.llm_engine.model_config.hf_config
    specials = [getattr(hf_config, name, None) for name in IMAGE_TOKEN_FIELDS]
    return min([llm.llm_engine.model_config.get_vocab_size(), *(i for i in specials if isinstance(i, int))])


def image_placeholder(llm) -> tuple[int, ...]:
    """The token ids that stand for one image in a prompt, which vLLM's processor expands to the image's tokens:
    Qwen2.5-VL's start, pad and end tokens, LLaVA's and Gemma 4's image token, Llama 4's placeholder; () for a
    model without images."""
    hf_config = llm.llm_engine.model_config.hf_config
    if isinstance(getattr(hf_config, "boi_token_index", None), int):
        return (llm.get_tokenizer().convert_tokens_to_ids(LLAMA4_IMAGE_PLACEHOLDER),)
    qwen = tuple(getattr(hf_config, name, None) for name in ("vision_start_token_id", "image_token_id",
                                                              "vision_end_token_id"))
    if all(isinstance(i, int) for i in qwen):
        return qwen
    image = getattr(hf_config, "image_token_index", None)
    if not isinstance(image, int) and isinstance(getattr(hf_config, "boi_token_id", None), int):
        image = getattr(hf_config, "image_token_id", None)
    return (image,) if isinstance(image, int) else ()


def with_images(limits: Limits, entry: Entry, images: tuple[tuple[int, int, int], ...], llm) -> Limits:
    """The sweep's limits sending ``images`` (the runner's traffic_images), within the entry's images a prompt."""
    if not images:
        return limits
    return dataclasses.replace(limits, image_sizes=images, images_per_prompt=images_per_prompt(entry),
                               image_placeholder=image_placeholder(llm))


def image_step_graphs(tokens: list[int], encoder_outputs: list[dict[str, Any]]) -> list[GraphSpec]:
    """Beyond tpu-inference's warm-up, what a step with image embeddings runs besides the merger under aotc's
    serving fixes: per token bucket the placeholder mask lifted to the device and the empty embedding buffer,
    per token bucket and encoder output (its shape's name) the copy of an image's encoder rows into it."""
    graphs = []
    for t in tokens:
        graphs += [GraphSpec.of("multimodal_mask", True, num_tokens=t),
                   GraphSpec.of("empty_embedding_rows", True, num_tokens=t)]
        graphs += [GraphSpec.of("place_encoder_rows", True, num_tokens=t, **output) for output in encoder_outputs]
    return graphs
