"""Where tpu-inference 0.32 compiles per request, the same work done where it cannot compile.

A server compiles mid-serving whenever a request's bookkeeping runs as eager JAX ops on device arrays: each
op is an XLA program keyed by its shapes, and those shapes follow the prompt or the batch, so no warm-up or
artifact can hold them all. These fixes keep every jitted graph of the stack as it is and move such
bookkeeping to the host or into jitted functions whose shapes are few and planned. The tpu-inference plugin
(twin_plugin.register) installs them in every process where aotc sits next to tpu-inference: the build,
verify and the serving pod alike, so the artifact holds what the pod compiles. Each is held equal to the code
it replaces by tests/tpu_inference/test_serving_fixes_jax.py. For Qwen2.5-VL (tpu-inference's JAX model):

* M-RoPE positions: `get_mrope_input_positions` builds a request's positions with jnp (concatenations
  shaped by where its images sit), and the runner slices them per prefill chunk (`jit_dynamic_slice`
  (3, prompt length) -> (3, chunk)): families quadratic in max_model_len. vLLM's own implementation of the
  same function is NumPy; the fix returns its result, so the runner's slicing stays on the host.
* Encoder inputs: an encoder batch's pixels are lifted to the device whole (`jit_stage`), sliced per image
  (`jit_dynamic_slice`), the images' embeddings joined and split back (`jit_concatenate`, `jit_split`),
  each shaped by which images share the batch. The fix slices the pixels on the host and keeps each
  image's embedding as the encoder returns it (the same arrays the split gave back).
* Embeddings into the step: each scheduled piece of an encoder output is sliced (`jit_dynamic_slice` by
  image size and prefill chunk), the pieces joined and padded to the step's token bucket
  (`jit_concatenate`, `jit_broadcast_in_dim` by how many pieces and rows). The fix copies each piece into
  one buffer of the bucket's rows with two jitted functions keyed by the token bucket and the encoder
  output's rows only (`empty_embedding_rows`, `place_encoder_rows`; planned `beyond_warmup`), and hands the
  merger that one buffer, as the stack's warm-up does.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

QWEN2_5_VL = "tpu_inference.models.jax.qwen2_5_vl"
MULTIMODAL_MANAGER = "tpu_inference.runner.multimodal_manager"
INSTALLED = "_aotc_serving_fix"


def install() -> None:
    from aotc.runners.watching import when_imported

    when_imported(QWEN2_5_VL, _fix_qwen2_5_vl)
    when_imported(MULTIMODAL_MANAGER, _fix_multimodal_manager)


def _fix_qwen2_5_vl(module) -> None:
    model = module.Qwen2_5_VLForConditionalGeneration
    if getattr(model, INSTALLED, False):
        return
    model.get_mrope_input_positions = host_mrope_input_positions
    model._parse_and_validate_image_input = _pixels_on_host(model._parse_and_validate_image_input)
    model._process_image_input = _each_image_alone(model._process_image_input)
    setattr(model, INSTALLED, True)


def _fix_multimodal_manager(module) -> None:
    manager = module.MultiModalManager
    if getattr(manager, INSTALLED, False):
        return
    manager.gather_mm_embeddings = _into_one_buffer(manager.gather_mm_embeddings)
    setattr(manager, INSTALLED, True)


# --- M-RoPE positions ---------------------------------------------------------------------------------


def host_mrope_input_positions(model, input_tokens: list[int], mm_features: list):
    """(positions int32[3, len(input_tokens)] as a NumPy array, delta): vLLM's Qwen2.5-VL implementation
    over the JAX model's Hugging Face config."""
    import numpy as np
    from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration as VllmQwen2_5_VL

    class ConfigOnly:  # what vLLM's methods read of their model
        config = model.config
        iter_mm_grid_thw = VllmQwen2_5_VL.iter_mm_grid_thw

    positions, delta = VllmQwen2_5_VL.get_mrope_input_positions(ConfigOnly(), input_tokens, mm_features)
    return np.asarray(positions, dtype=np.int32), delta


# --- encoder inputs -------------------------------------------------------------------------------------


def host_rows(pixels):
    """The stack's _validate_and_reshape_mm_tensor (rows of patches), as a host array."""
    import numpy as np

    if isinstance(pixels, (list, tuple)):
        return np.concatenate([np.asarray(p) for p in pixels], axis=0)
    pixels = np.asarray(pixels)
    return pixels.reshape(-1, pixels.shape[-1]) if pixels.ndim == 3 else pixels


def _pixels_on_host(parse):
    @functools.wraps(parse)
    def parse_pixels_on_host(model, **kwargs):
        if kwargs.get("pixel_values") is None or kwargs.get("image_embeds") is not None:
            return parse(model, **kwargs)
        return {"type": "pixel_values", "pixel_values": host_rows(kwargs["pixel_values"]),
                "image_grid_thw": kwargs.get("image_grid_thw")}

    return parse_pixels_on_host


def _each_image_alone(process):
    @functools.wraps(process)
    def encode_each_image(model, image_input):
        import jax
        import numpy as np

        pixels = image_input["pixel_values"]
        if image_input["type"] != "pixel_values" or not isinstance(pixels, np.ndarray):
            return process(model, image_input)
        embeddings, start = [], 0
        for grid in image_input["image_grid_thw"]:
            end = start + int(np.prod(grid))
            embeddings.append(model.get_single_image_embedding(jax.device_put(pixels[start:end]), grid))
            start = end
        return tuple(embeddings)

    return encode_each_image


# --- embeddings into the step ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RowRange:
    """Rows [start, start + count) of an encoder output, not yet sliced on the device."""

    array: Any
    start: int
    count: int


@dataclass(frozen=True)
class EncoderRows:
    array: Any

    def __getitem__(self, rows: slice) -> RowRange:
        start, stop, step = rows.indices(self.array.shape[0])
        assert step == 1, "encoder rows are taken in order"
        return RowRange(self.array, start, stop - start)


class EncoderRowsView:
    """The runner's encoder cache as gather_mm_embeddings reads it, handing out row ranges."""

    def __init__(self, cache: dict):
        self.cache = cache

    def get(self, key, default=None):
        return EncoderRows(self.cache[key]) if key in self.cache else default

    def __getitem__(self, key):
        return EncoderRows(self.cache[key])


def _into_one_buffer(gather):
    signature = inspect.signature(gather)

    @functools.wraps(gather)
    def gather_into_one_buffer(manager, *args, **kwargs):
        runner = manager.runner
        cache, runner.encoder_cache = runner.encoder_cache, EncoderRowsView(runner.encoder_cache)
        try:
            pieces, is_mm_embed = gather(manager, *args, **kwargs)
        finally:
            runner.encoder_cache = cache
        if pieces is None:
            return pieces, is_mm_embed
        rows = signature.bind(manager, *args, **kwargs).arguments["target_pad_len"]
        return [placed_rows(runner.mesh, pieces, rows)], is_mm_embed

    return gather_into_one_buffer


def embedding_sharding(mesh):
    """The sharding the stack's warm-up gives the merger's embeddings (_precompile_input_embeddings_merger)."""
    from jax.sharding import NamedSharding, PartitionSpec
    from tpu_inference.layers.common.sharding import ShardingAxisName

    return NamedSharding(mesh, PartitionSpec(ShardingAxisName.ATTN_DATA, None))


def placed_rows(mesh, pieces: list[RowRange], rows: int):
    """The pieces one after another in a (rows, width) buffer, zeros after them: what the stack's
    flatten_pad_mm_embeds makes of the sliced pieces."""
    first = pieces[0].array
    sharding = embedding_sharding(mesh)
    buffer = empty_embedding_rows(rows, first.shape[-1], first.dtype, sharding)
    offset = 0
    for piece in pieces:
        buffer = place_encoder_rows(buffer, piece.array, piece.start, offset, piece.count, sharding)
        offset += piece.count
    return buffer


@functools.cache
def _jitted():
    import jax
    import jax.numpy as jnp

    @functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
    def empty_embedding_rows(rows, width, dtype, sharding):
        return jax.lax.with_sharding_constraint(jnp.zeros((rows, width), dtype), sharding)

    @functools.partial(jax.jit, static_argnums=(5,))
    def place_encoder_rows(buffer, encoder_rows, src_start, dst_start, count, sharding):
        index = jnp.arange(buffer.shape[0])
        source = jnp.clip(index - dst_start + src_start, 0, encoder_rows.shape[0] - 1)
        inside = (index >= dst_start) & (index < dst_start + count)
        placed = jnp.where(inside[:, None], encoder_rows[source].astype(buffer.dtype), buffer)
        return jax.lax.with_sharding_constraint(placed, sharding)

    return empty_embedding_rows, place_encoder_rows


def empty_embedding_rows(rows: int, width: int, dtype, sharding):
    return _jitted()[0](rows, width, dtype, sharding)


def place_encoder_rows(buffer, encoder_rows, src_start: int, dst_start: int, count: int, sharding):
    return _jitted()[1](buffer, encoder_rows, src_start, dst_start, count, sharding)
