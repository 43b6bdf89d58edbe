"""What the serving fixes share: patching a stack class once, a temporary attribute, pixels on the host, and an
image's encoder output kept whole (not sliced on the device) with the place of its rows.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

INSTALLED = "_aotc_serving_fix"


def wrap_once(owner, **wrappers) -> None:
    """Each ``owner.name`` becomes ``wrappers[name](owner.name)``, once however often the fixes are installed."""
    if getattr(owner, INSTALLED, False):
        return
    for name, wrap in wrappers.items():
        setattr(owner, name, wrap(getattr(owner, name)))
    setattr(owner, INSTALLED, True)


@contextlib.contextmanager
def attribute_set(owner, name: str, value):
    """`owner.name` is `value` inside the block and what it was before after it, however the block ends."""
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield before
    finally:
        setattr(owner, name, before)


def each_image(values) -> list:
    """vLLM's encoder batch (one tensor, one image's 2-D rows, or a list) as a list of per-image rows."""
    return list(values) if isinstance(values, (list, tuple)) or values.ndim == 3 else [values]


def host_pixels(values) -> list:
    """Each image's patches as a bfloat16 host array (the stack's torch-to-jnp conversion, without the device)."""
    import numpy as np
    import torch
    from ml_dtypes import bfloat16

    return [np.asarray(i.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(bfloat16)
                       if isinstance(i, torch.Tensor) else i) for i in each_image(values)]


def host_positions(values) -> list:
    """Each image's patch positions as an int32 host array."""
    import numpy as np
    import torch

    return [np.asarray(i.to(torch.int32).numpy() if isinstance(i, torch.Tensor) else i, dtype=np.int32)
            for i in each_image(values)]


def on_host(parse, host_inputs):
    """``parse`` with the image inputs kept on the host: host_inputs(kwargs), the model's fields as host arrays."""
    @functools.wraps(parse)
    def parse_pixels_on_host(model, **kwargs):
        if kwargs.get("pixel_values") is None or kwargs.get("image_embeds") is not None:
            return parse(model, **kwargs)
        return {"type": "pixel_values", **host_inputs(kwargs)}

    return parse_pixels_on_host


@dataclass(frozen=True)
class WholeEncoderOutput:
    """An image's encoder output as a jitted encoder returns it, not sliced on the device: padded to its patch
    bucket (Qwen2.5-VL with dynamic sizes), one row of tokens a tile, (tiles, tokens_per_tile, width) (Llama
    Guard 4), or a token budget's shared by the images packed into it (Qwen3-VL). Flattened to (rows, width), as
    place_encoder_rows does inside its jit, the `count` rows from `start` are the image's."""

    array: Any
    count: int
    start: int = 0

    ndim = 2  # an embedding as the runner's sanity check sees it: (count, width)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.count, self.array.shape[-1])
