"""Qwen2.5-VL (tpu-inference's JAX model).

* M-RoPE positions: `get_mrope_input_positions` builds a request's positions with jnp (concatenations
  shaped by where its images sit), and the runner slices them per prefill chunk (`jit_dynamic_slice`
  (3, prompt length) -> (3, chunk)): families quadratic in max_model_len. vLLM's own implementation of the
  same function is NumPy; the fix returns its result, so the runner's slicing stays on the host.
* Encoder inputs: an encoder batch's pixels are lifted to the device whole (`jit_stage`), sliced per image
  (`jit_dynamic_slice`), the images' embeddings joined and split back (`jit_concatenate`, `jit_split`),
  each shaped by which images share the batch. The fix slices the pixels on the host and keeps each
  image's embedding as the encoder returns it (the same arrays the split gave back).
* Images of any size (enable_dynamic_image_sizes): the padded encoder's inputs (window index, rotary table,
  sequence bounds, padded to the patch bucket) are built with eager ops shaped by the image, and its output
  sliced to the image's rows. The fix builds them in NumPy and keeps the padded output whole with its row
  count (WholeEncoderOutput), so place_encoder_rows is keyed by the patch bucket, not the image.

Its embeddings into the step are step_embeddings' (every multimodal model's); its vision warm-up's dtype,
warmup_dtype's.
"""

from __future__ import annotations

import functools

from .common import WholeEncoderOutput, on_host, wrap_once
from .warmup_dtype import in_the_models_dtype


def fix(module) -> None:
    wrap_once(module.Qwen2_5_VLForConditionalGeneration,
              get_mrope_input_positions=lambda _: host_mrope_input_positions,
              _parse_and_validate_image_input=_pixels_on_host, _process_image_input=_each_image_alone,
              precompile_vision_encoder=in_the_models_dtype)


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
    return on_host(parse, lambda kwargs: {"pixel_values": host_rows(kwargs["pixel_values"]),
                                           "image_grid_thw": kwargs.get("image_grid_thw")})


def _each_image_alone(process):
    @functools.wraps(process)
    def encode_each_image(model, image_input):
        import jax
        import numpy as np

        pixels = image_input["pixel_values"]
        if image_input["type"] != "pixel_values" or not isinstance(pixels, np.ndarray):
            return process(model, image_input)
        padded = getattr(model.visual, "enable_dynamic_image_sizes", False)
        embeddings, start = [], 0
        for grid in image_input["image_grid_thw"]:
            end = start + int(np.prod(grid))
            embeddings.append(padded_image_embedding(model.visual, pixels[start:end], grid) if padded else
                              model.get_single_image_embedding(jax.device_put(pixels[start:end]), grid))
            start = end
        return tuple(embeddings)

    return encode_each_image


# --- images of any size (additional_config.enable_dynamic_image_sizes) ----------------------------------
# The stack pads an image's encoder inputs to a power-of-two patch count and runs the padded encoder its
# warm-up compiled per count, but builds those inputs with eager device ops shaped by the image's grid
# (Qwen2_5_VisionTransformer.compute_aux_arrays, pad_inputs) and slices the output to the image's rows
# (`hidden_states[:num_tokens]`): a compile per image size. The fix builds the same inputs on the host (NumPy,
# held equal to the stack's code) and keeps the padded output whole, with the count of the image's rows.


def padded_image_embedding(visual, pixels, grid) -> WholeEncoderOutput:
    """Qwen2_5_VisionTransformer.__call__ with enable_dynamic_image_sizes, its eager steps on the host."""
    import jax

    inputs, count = host_padded_encoder_inputs(visual, pixels, (tuple(int(side) for side in grid),))
    return WholeEncoderOutput(visual.encode_padded_jit(*(jax.device_put(a) for a in inputs)), count)


def host_padded_encoder_inputs(visual, pixels, grid_thw) -> tuple[tuple, int]:
    """(x_padded, window_index, rotary_pos_emb, cu_seqlens, cu_window_seqlens), num_tokens: the stack's
    compute_aux_arrays then pad_inputs, in NumPy, in the dtypes the stack's arrays have."""
    import numpy as np

    unit = visual.spatial_merge_unit
    window_index, rotary, cu_seqlens, cu_window_seqlens = host_aux_arrays(visual, grid_thw)
    num_patches, num_tokens = rotary.shape[0], window_index.shape[0]
    bucket_patches = 1 << (num_patches - 1).bit_length()
    bucket_tokens = bucket_patches // unit
    max_windows = bucket_tokens // _merger_window(visual) + 2
    rotary = np.pad(rotary, ((0, bucket_patches - num_patches), (0, 0)))
    window_index = np.concatenate([window_index, np.arange(num_tokens, bucket_tokens, dtype=np.int32)])
    cu_window_seqlens = np.append(cu_window_seqlens, bucket_patches).astype(np.int32)
    cu_window_seqlens = np.pad(cu_window_seqlens, (0, max(0, max_windows + 1 - cu_window_seqlens.shape[0])),
                               mode="edge")
    cu_seqlens = np.append(cu_seqlens, bucket_patches).astype(np.int32)
    x_padded = np.pad(pixels, ((0, bucket_patches - pixels.shape[0]), (0, 0)))
    return (x_padded, window_index, rotary, cu_seqlens, cu_window_seqlens), num_tokens


def _merger_window(visual) -> int:
    return visual.window_size // visual.spatial_merge_size // visual.patch_size


def host_aux_arrays(visual, grid_thw):
    """Qwen2_5_VisionTransformer.compute_aux_arrays: window_index, rotary_pos_emb, cu_seqlens,
    cu_window_seqlens for the images' grids."""
    import numpy as np

    window_index, rotary, cu_seqlens = [], [], []
    cu_window_seqlens, index_offset, window_offset = [np.zeros(1, np.int32)], 0, 0
    for t, h, w in grid_thw:
        index, cu_window = _window_index(visual, t, h, w)
        rotary.append(_rotary_pos_emb(visual, t, h, w)[index].reshape(-1, visual.rotary_pos_emb.dim))
        window_index.append((index + index_offset).astype(np.int32))
        index_offset += index.shape[0]  # the image's merged patches
        cu_window = (cu_window + window_offset).astype(np.int32)
        window_offset = int(cu_window[-1])
        cu_window_seqlens.append(cu_window)
        cu_seqlens.append(np.full(t, h * w, np.int32))
    cu_seqlens = np.pad(np.cumsum(np.concatenate(cu_seqlens), dtype=np.int32), (1, 0))
    return (np.concatenate(window_index), np.concatenate(rotary), cu_seqlens,
            np.concatenate(cu_window_seqlens))


def _window_index(visual, t: int, h: int, w: int):
    """get_window_index_thw: the merged patches in window order, and the windows' cumulative patch counts."""
    import numpy as np

    size, merge = _merger_window(visual), visual.spatial_merge_size
    grid_h, grid_w = h // merge, w // merge
    pad_h, pad_w = size - grid_h % size, size - grid_w % size
    windows_h, windows_w = (grid_h + pad_h) // size, (grid_w + pad_w) // size
    index = np.pad(np.arange(t * grid_h * grid_w, dtype=np.int32).reshape(t, grid_h, grid_w),
                   ((0, 0), (0, pad_h), (0, pad_w)), constant_values=-100)
    index = index.reshape(t, windows_h, size, windows_w, size).transpose(0, 1, 3, 2, 4)
    index = index.reshape(t, windows_h * windows_w, size, size)
    seqlens = (index != -100).sum((2, 3)).reshape(-1)
    index = index.reshape(-1)
    return index[index != -100], (np.cumsum(seqlens) * visual.spatial_merge_unit).astype(np.int32)


def _rotary_pos_emb(visual, t: int, h: int, w: int):
    """rotary_pos_emb_thw: each patch's (row, column) frequencies, grouped by merged patch."""
    import numpy as np
    from ml_dtypes import bfloat16

    merge = visual.spatial_merge_size

    def merged_order(ids):
        return ids.reshape(h // merge, merge, w // merge, merge).transpose(0, 2, 1, 3).flatten()

    rows, columns = np.indices((h, w))
    positions = np.tile(np.stack([merged_order(rows), merged_order(columns)], axis=-1), (t, 1))
    embedding = visual.rotary_pos_emb  # Qwen2_5_VisionRotaryEmbedding: float32 frequencies, kept in bfloat16
    inverse = 1.0 / (embedding.theta ** (np.arange(0, embedding.dim, 2, dtype=np.float32) / embedding.dim))
    table = np.outer(np.arange(max(h, w), dtype=np.float32), inverse).astype(bfloat16)
    return table[positions].reshape(positions.shape[0] // visual.spatial_merge_unit, visual.spatial_merge_unit, -1)
