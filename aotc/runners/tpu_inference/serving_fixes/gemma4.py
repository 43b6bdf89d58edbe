"""Gemma 4 (tpu-inference's JAX Gemma4ForConditionalGeneration).

An encoder batch's pixels and positions are lifted to the device whole and sliced per image there (eager
slices keyed by how many images share the batch), and a batch whose images were processed at different
soft-token budgets (vLLM hands over a list) fails. The fix keeps them on the host and encodes each image
alone, as the stack does with one image.
"""

from __future__ import annotations

import functools

from .common import each_image, host_pixels, on_host, wrap_once


def fix(module) -> None:
    wrap_once(module.Gemma4ForConditionalGeneration, _parse_and_validate_image_input=_gemma4_pixels_on_host,
              _process_image_input=_each_image_alone_on_host)


def host_positions(values) -> list:
    """Each image's patch positions as an int32 host array."""
    import numpy as np
    import torch

    return [np.asarray(i.to(torch.int32).numpy() if isinstance(i, torch.Tensor) else i, dtype=np.int32)
            for i in each_image(values)]


def _gemma4_pixels_on_host(parse):
    return on_host(parse, lambda kwargs: {"pixel_values": host_pixels(kwargs["pixel_values"]),
                                           "pixel_position_ids": host_positions(kwargs["pixel_position_ids"])})


def _each_image_alone_on_host(process):
    @functools.wraps(process)
    def encode_each_image(model, image_input):
        if not isinstance(image_input["pixel_values"], list):
            return process(model, image_input)
        return [rows for pixels, positions in zip(image_input["pixel_values"], image_input["pixel_position_ids"])
                for rows in process(model, {**image_input, "pixel_values": pixels[None],
                                            "pixel_position_ids": positions[None]})]

    return encode_each_image
