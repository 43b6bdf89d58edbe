"""LLaVA 1.5 (`LlavaForConditionalGeneration`: a CLIP or SigLIP tower, every image resized to its size) as both
stacks serve it, read from its config alone: vLLM 0.13's TPU runner and vLLM 0.32's model through tpu-inference's
torchax path."""

from __future__ import annotations

ARCHITECTURE = "LlavaForConditionalGeneration"
# Images a sweep and the canary send, [height, width]: sizes and aspects the processor resizes to the tower's size.
TRAFFIC_IMAGE_SHAPES = ([56, 56], [112, 84], [40, 72])


def is_llava(hf_config: dict | None) -> bool:
    return ARCHITECTURE in ((hf_config or {}).get("architectures") or [])


def image_tokens(hf_config: dict) -> int:
    """Tokens one image takes (LlavaProcessingInfo.get_num_image_tokens): a CLIP tower's patches, its class
    token too under vision_feature_select_strategy 'full'."""
    vision = hf_config["vision_config"]
    patches = (vision.get("image_size", 224) // vision.get("patch_size", 32)) ** 2
    return patches + (hf_config.get("vision_feature_select_strategy", "default") == "full")


def image_side(hf_config: dict) -> int:
    """The side, in pixels, the processor resizes every image to: the tower's input."""
    return int(hf_config["vision_config"].get("image_size", 224))


def traffic_images(hf_config: dict) -> tuple[tuple[int, int, int], ...]:
    """(height, width, prompt tokens) of the images a sweep and the canary send."""
    return tuple((h, w, image_tokens(hf_config)) for h, w in TRAFFIC_IMAGE_SHAPES)
