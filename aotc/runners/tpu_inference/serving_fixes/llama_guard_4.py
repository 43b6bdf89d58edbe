"""Llama Guard 4 (tpu-inference's JAX LlamaGuard4ForCausalLM).

embed_multimodal lifts a batch's tiles to the device, transposes them and runs the vision tower and projector
as eager ops over all of them, then flattens and splits the output per image: compiles keyed by how many tiles
the batch holds and how they split. The fix keeps the tiles on the host and runs each image's tiles through
the stack's own jitted tower (_compute_vision_features_jit): one graph per tile count, its output whole
(WholeEncoderOutput).
"""

from __future__ import annotations

import functools

from .common import WholeEncoderOutput, host_pixels, wrap_once


def fix(module) -> None:
    wrap_once(module.LlamaGuard4ForCausalLM, embed_multimodal=_each_image_by_its_tiles)


def host_tiles(values):
    """A batch's tiles as one NHWC bfloat16 host array (the stack's conversion and NCHW -> NHWC transpose)."""
    import numpy as np

    tiles = np.concatenate(host_pixels(values), axis=0) if isinstance(values, (list, tuple)) else host_pixels(values)[0]
    return tiles.transpose(0, 2, 3, 1) if tiles.ndim == 4 and tiles.shape[1] == 3 else tiles


def tile_counts(patches_per_image) -> list[int]:
    """embed_multimodal's tile count per image (a tensor, a list, or a list of lists)."""
    counts = patches_per_image.tolist() if hasattr(patches_per_image, "tolist") else list(patches_per_image)
    return [int(n) for c in counts for n in (c if isinstance(c, list) else [c])]


def _each_image_by_its_tiles(embed):
    @functools.wraps(embed)
    def encode_each_image(model, **kwargs):
        import jax

        if kwargs.get("pixel_values") is None or kwargs.get("patches_per_image") is None:
            return embed(model, **kwargs)
        tiles, outputs, start = host_tiles(kwargs["pixel_values"]), [], 0
        for count in tile_counts(kwargs["patches_per_image"]):
            image = jax.device_put(tiles[start:start + count])
            features = model._compute_vision_features_jit(image)  # (tiles, tokens_per_tile, width)
            outputs.append(WholeEncoderOutput(features, features.shape[0] * features.shape[1]))
            start += count
        return outputs

    return encode_each_image
