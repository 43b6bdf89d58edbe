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
* Images of any size (enable_dynamic_image_sizes): the padded encoder's inputs (window index, rotary table,
  sequence bounds, padded to the patch bucket) are built with eager ops shaped by the image, and its output
  sliced to the image's rows. The fix builds them in NumPy and keeps the padded output whole with its row
  count (WholeEncoderOutput), so place_encoder_rows is keyed by the patch bucket, not the image.
* Gemma 4 (tpu-inference's JAX Gemma4ForConditionalGeneration): an encoder batch's pixels and positions are
  lifted to the device whole and sliced per image there (eager slices keyed by how many images share the
  batch), and a batch whose images were processed at different soft-token budgets (vLLM hands over a list)
  fails. The fix keeps them on the host and encodes each image alone, as the stack does with one image.
* Llama Guard 4 (tpu-inference's JAX LlamaGuard4ForCausalLM): embed_multimodal lifts a batch's tiles to the
  device, transposes them and runs the vision tower and projector as eager ops over all of them, then flattens
  and splits the output per image: compiles keyed by how many tiles the batch holds and how they split. The fix
  keeps the tiles on the host and runs each image's tiles through the stack's own jitted tower
  (_compute_vision_features_jit): one graph per tile count, its output whole (WholeEncoderOutput).
* LLaVA (vLLM's PyTorch model, on tpu-inference's torchax path): the wrapper runs vLLM's embed_input_ids
  unjitted ("cannot be JITted directly due to its dynamic implementation": vLLM's merge writes the images'
  rows through a boolean mask, `inputs_embeds[is_multimodal] = rows`, whose row count is data-dependent) and
  the vision tower and projector as eager torchax ops over an encoder batch: every step with images compiles
  op by op, keyed by the step's image tokens, and every batch by its image count. The fix jits
  embed_input_ids whole, with vLLM's merge taking the one buffer's rows in order (row i to the i-th
  placeholder, the gather tpu-inference's JAX models merge with), and runs each image through the jitted tower
  alone (one pixel shape: the processor resizes every image to the tower's size). Other vLLM multimodal
  models keep the stack's own functions and gather_mm_embeddings' own pieces: vLLM's merge, run eagerly under
  torchax, writes a buffer as long as the step row for row (buffer row i to position i), misplacing its rows.
* Qwen3-VL (vLLM's PyTorch model on the torchax path, with cudagraph_mm_encoder): the stack's
  MMEncoderJITManager runs the tower once per token budget, then slices each image's rows off the budget's
  output on the device (a compile per image token count and place in the batch); its wrapper runs
  embed_input_ids unjitted (text embedding, deepstack split, merge and deepstack packing as eager ops). The fix
  keeps each budget output whole with the image's place in it (WholeEncoderOutput.start), and jits
  embed_input_ids as for LLaVA: Qwen3-VL's module keeps the stack's merge (a gather of the rows in order), and
  each trace starts with no deepstack rows kept on the model and leaves none behind.
* The vision warm-up (precompile_vision_encoder) makes its dummy pixels with vLLM's torch dtype, which jnp
  refuses at start-up; it runs with the JAX dtype the model was built with.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass
from typing import Any

QWEN2_5_VL = "tpu_inference.models.jax.qwen2_5_vl"
GEMMA4_MM = "tpu_inference.models.jax.gemma4_mm"
LLAMA_GUARD_4 = "tpu_inference.models.jax.llama_guard_4"
MULTIMODAL_MANAGER = "tpu_inference.runner.multimodal_manager"
VLLM_MODEL_WRAPPER = "tpu_inference.models.vllm.vllm_model_wrapper"
MM_ENCODER_JIT_MANAGER = "tpu_inference.runner.mm_encoder_jit_manager"
# vLLM models on the torchax path whose image steps the fixes jit (planned by aotc/runners/tpu_inference/buckets.py):
# LLaVA's tower and merge; the merge alone of Qwen3-VL and its kin (qwen3_vl.ARCHITECTURES: their tower runs
# through the stack's MMEncoderJITManager)
JITTED_TORCHAX_TOWERS = frozenset({"LlavaForConditionalGeneration"})
JITTED_TORCHAX_MERGES_ONLY = frozenset({"Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
                                       "Cosmos3ForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                                       "Qwen3_5MoeForConditionalGeneration"})
# set False on an embed_input_ids_fn whose merge needs gather_mm_embeddings' own pieces
TAKES_ONE_BUFFER = "_aotc_takes_one_buffer"
INSTALLED = "_aotc_serving_fix"


def install() -> None:
    from aotc.runners.watching import when_imported

    when_imported(QWEN2_5_VL, _fix_qwen2_5_vl)
    when_imported(GEMMA4_MM, _fix_gemma4)
    when_imported(LLAMA_GUARD_4, _fix_llama_guard_4)
    when_imported(MULTIMODAL_MANAGER, _fix_multimodal_manager)
    when_imported(VLLM_MODEL_WRAPPER, _fix_vllm_model_wrapper)
    when_imported(MM_ENCODER_JIT_MANAGER, _fix_mm_encoder_jit_manager)


def _fix_qwen2_5_vl(module) -> None:
    _wrap_once(module.Qwen2_5_VLForConditionalGeneration,
               get_mrope_input_positions=lambda _: host_mrope_input_positions,
               _parse_and_validate_image_input=_pixels_on_host, _process_image_input=_each_image_alone,
               precompile_vision_encoder=_warm_up_in_the_models_dtype)


def _fix_gemma4(module) -> None:
    _wrap_once(module.Gemma4ForConditionalGeneration, _parse_and_validate_image_input=_gemma4_pixels_on_host,
               _process_image_input=_each_image_alone_on_host)


def _fix_llama_guard_4(module) -> None:
    _wrap_once(module.LlamaGuard4ForCausalLM, embed_multimodal=_each_image_by_its_tiles)


def _fix_multimodal_manager(module) -> None:
    _wrap_once(module.MultiModalManager, gather_mm_embeddings=_into_one_buffer)


def _fix_vllm_model_wrapper(module) -> None:
    _wrap_once(module, maybe_jit_embed_multimodal_func=_jit_planned_towers)
    _wrap_once(module.VllmModelWrapper, wrap_embed_multimodal_func=_each_image_through_the_jitted_tower,
               wrap_embed_input_ids_func=_merged_in_one_jit)


def _fix_mm_encoder_jit_manager(module) -> None:
    _wrap_once(module._TorchaxEncoderModelAdapter, postprocess_encoder_output=lambda _: _whole_budget_outputs)


def _wrap_once(owner, **wrappers) -> None:
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


def _warm_up_in_the_models_dtype(precompile):
    """tpu-inference's get_flax_model gives the model config a JAX dtype while it builds the model and puts
    vLLM's torch dtype back after; the vision warm-up runs later and makes its dummy pixels with
    model_config.dtype, which jnp refuses (TypeError: Cannot interpret 'torch.bfloat16'), so a server with
    vision_warmup_config or enable_dynamic_image_sizes died at start-up. The warm-up runs with the dtype the
    model was built with: the pixels' dtype at serving (vLLM hands over bfloat16 pixels)."""

    @functools.wraps(precompile)
    def precompile_in_the_models_dtype(model, *args, **kwargs):
        from tpu_inference.utils import to_jax_dtype

        model_config = model.vllm_config.model_config
        with attribute_set(model_config, "dtype", to_jax_dtype(model_config.dtype)):
            return precompile(model, *args, **kwargs)

    return precompile_in_the_models_dtype


# --- Gemma 4 encoder inputs ------------------------------------------------------------------------------


def _each_image(values) -> list:
    """vLLM's encoder batch (one tensor, one image's 2-D rows, or a list) as a list of per-image rows."""
    return list(values) if isinstance(values, (list, tuple)) or values.ndim == 3 else [values]


def host_pixels(values) -> list:
    """Each image's patches as a bfloat16 host array (the stack's torch-to-jnp conversion, without the device)."""
    import numpy as np
    import torch
    from ml_dtypes import bfloat16

    return [np.asarray(i.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(bfloat16)
                       if isinstance(i, torch.Tensor) else i) for i in _each_image(values)]


def host_positions(values) -> list:
    """Each image's patch positions as an int32 host array."""
    import numpy as np
    import torch

    return [np.asarray(i.to(torch.int32).numpy() if isinstance(i, torch.Tensor) else i, dtype=np.int32)
            for i in _each_image(values)]


def _gemma4_pixels_on_host(parse):
    return _on_host(parse, lambda kwargs: {"pixel_values": host_pixels(kwargs["pixel_values"]),
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


# --- encoder outputs kept whole ------------------------------------------------------------------------


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


# --- Llama Guard 4 tiles -------------------------------------------------------------------------------


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


# --- vLLM's PyTorch models through torchax ---------------------------------------------------------------


def jitted_torchax_tower(vllm_model) -> bool:
    """A vLLM model whose tower the fixes jit: LLaVA with a fixed-size tower (not Pixtral's)."""
    return (type(vllm_model).__name__ in JITTED_TORCHAX_TOWERS
            and getattr(vllm_model.config.vision_config, "model_type", None) != "pixtral")


def jitted_torchax_merge(vllm_model) -> bool:
    """A vLLM model whose embed_input_ids the fixes jit whole, taking the step's one buffer."""
    return jitted_torchax_tower(vllm_model) or type(vllm_model).__name__ in JITTED_TORCHAX_MERGES_ONLY


@functools.cache
def _jit(function):
    import jax

    return jax.jit(function)


def _jit_planned_towers(maybe_jit):
    @functools.wraps(maybe_jit)
    def jit_planned_towers(embed_multimodal_func_jax, vllm_model):
        if jitted_torchax_tower(vllm_model):
            return _jit(embed_multimodal_func_jax)
        return maybe_jit(embed_multimodal_func_jax, vllm_model)

    return jit_planned_towers


def _each_image_through_the_jitted_tower(wrap):
    @functools.wraps(wrap)
    def wrap_each_image(wrapper):
        embed = wrap(wrapper)
        if embed is None or not jitted_torchax_tower(wrapper.model.vllm_model):
            return embed

        @functools.wraps(embed)
        def encode_each_image(params_and_buffers, modality=None, **kwargs):
            if modality != "image" or set(kwargs) != {"pixel_values"}:
                return embed(params_and_buffers, modality=modality, **kwargs)
            outputs = []
            for image in kwargs["pixel_values"]:  # (images, channels, height, width), or a list of images
                rows = embed(params_and_buffers, modality=modality, pixel_values=image[None])  # (1, tokens, width)
                outputs.append(WholeEncoderOutput(rows, rows.shape[0] * rows.shape[1]))
            return outputs

        return encode_each_image

    return wrap_each_image


def _merged_in_one_jit(wrap):
    @functools.wraps(wrap)
    def wrap_in_one_jit(wrapper):
        embed = wrap(wrapper)
        if embed is None:
            return embed
        vllm_model = wrapper.model.vllm_model
        if not jitted_torchax_merge(vllm_model):
            setattr(embed, TAKES_ONE_BUFFER, False)
            return embed
        import jax

        @functools.wraps(embed)
        def embed_input_ids_in_order(params_and_buffers, input_ids, mm_embeds=None, *, is_multimodal=None):
            # traced once per token bucket, with vLLM's merge swapped; the stack's Qwen3-VL patches keep the step's
            # deepstack rows on the model, so each trace starts from none and leaves no tracer behind
            with _vllm_merge_swapped(vllm_model), _no_deepstack_rows_kept(vllm_model):
                return embed(params_and_buffers, input_ids, mm_embeds, is_multimodal=is_multimodal)

        return jax.jit(embed_input_ids_in_order)

    return wrap_in_one_jit


@contextlib.contextmanager
def _vllm_merge_swapped(vllm_model):
    """vLLM's _merge_multimodal_embeddings is merge_rows_in_order inside the block, in vLLM's utils module and in
    the model's own module where that imported it under its name (Qwen3.5's); a module holding another merge
    (Qwen3-VL's: the stack's own, a gather of the rows in order already) keeps it."""
    import sys

    import vllm.model_executor.models.utils as vllm_model_utils

    name, vllms = "_merge_multimodal_embeddings", vllm_model_utils._merge_multimodal_embeddings
    owners = {vllm_model_utils, sys.modules[type(vllm_model).__module__]}
    with contextlib.ExitStack() as swaps:
        for owner in owners:
            if getattr(owner, name, None) is vllms:
                swaps.enter_context(attribute_set(owner, name, merge_rows_in_order))
        yield


@contextlib.contextmanager
def _no_deepstack_rows_kept(vllm_model):
    """The stack's Qwen3-VL patches keep a step's deepstack rows on the model (`_deepstack_tensors`, set on its
    first image step) and pack whatever is there into the next embedding: a trace starts from none, and leaves
    none behind (a tracer kept there would outlive its trace)."""
    if not getattr(vllm_model, "use_deepstack", False):
        yield
        return
    vllm_model._deepstack_tensors = {}
    try:
        yield
    finally:
        vllm_model._deepstack_tensors = {}


def _whole_budget_outputs(adapter, output, indices, per_item_out_tokens, dest, clone=False, batch_mm_kwargs=None):
    """The stack's postprocess of a token budget's encoder output slices each image's rows on the device, a
    compile per image size and place in the batch; each image keeps the budget's output whole with its rows'
    place in it, and place_encoder_rows takes them from there (keyed by the budget)."""
    if isinstance(output, dict):
        output = output["default"]
    offset = 0
    for index in indices:
        count = per_item_out_tokens[index]
        dest[index] = WholeEncoderOutput(output, count, offset)
        offset += count


def merge_rows_in_order(inputs_embeds, multimodal_embeddings, is_multimodal):
    """vLLM's _merge_multimodal_embeddings without its boolean-mask write: the i-th placeholder takes row i of
    the embeddings, rows after the last placeholder's (a padded buffer's) are not read. Equal to vLLM's merge
    wherever it accepts the rows (as many as placeholders)."""
    import torch
    from vllm.model_executor.models.utils import _flatten_embeddings

    if len(multimodal_embeddings) == 0:
        return inputs_embeds
    rows = _flatten_embeddings(multimodal_embeddings).to(dtype=inputs_embeds.dtype)
    index = (torch.cumsum(is_multimodal.to(torch.int32), dim=0) - 1).clamp(0, rows.shape[0] - 1)
    return torch.where(is_multimodal.unsqueeze(-1), rows[index], inputs_embeds)


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


def _on_host(parse, host_inputs):
    """``parse`` with the image inputs kept on the host: host_inputs(kwargs), the model's fields as host arrays."""
    @functools.wraps(parse)
    def parse_pixels_on_host(model, **kwargs):
        if kwargs.get("pixel_values") is None or kwargs.get("image_embeds") is not None:
            return parse(model, **kwargs)
        return {"type": "pixel_values", **host_inputs(kwargs)}

    return parse_pixels_on_host


def _pixels_on_host(parse):
    return _on_host(parse, lambda kwargs: {"pixel_values": host_rows(kwargs["pixel_values"]),
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


# --- embeddings into the step ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RowRange:
    """Rows [start, start + count) of an encoder output, not yet sliced on the device."""

    array: Any
    start: int
    count: int


@dataclass(frozen=True)
class EncoderRows:
    """An encoder output's `rows` rows from `start` (all of them, or a padded output's image rows)."""

    array: Any
    rows: int
    start: int = 0

    @classmethod
    def of(cls, output) -> EncoderRows:
        if isinstance(output, WholeEncoderOutput):
            return cls(output.array, output.count, output.start)
        return cls(output, output.shape[0])

    def __getitem__(self, rows: slice) -> RowRange:
        start, stop, step = rows.indices(self.rows)
        assert step == 1, "encoder rows are taken in order"
        return RowRange(self.array, self.start + start, stop - start)


class EncoderRowsView:
    """The runner's encoder cache as gather_mm_embeddings reads it, handing out row ranges."""

    def __init__(self, cache: dict):
        self.cache = cache

    def get(self, key, default=None):
        return EncoderRows.of(self.cache[key]) if key in self.cache else default

    def __getitem__(self, key):
        return EncoderRows.of(self.cache[key])


def _into_one_buffer(gather):
    signature = inspect.signature(gather)

    @functools.wraps(gather)
    def gather_into_one_buffer(manager, *args, **kwargs):
        runner = manager.runner
        if not getattr(runner.embed_input_ids_fn, TAKES_ONE_BUFFER, True):
            return gather(manager, *args, **kwargs)
        with attribute_set(runner, "encoder_cache", EncoderRowsView(runner.encoder_cache)):
            pieces, is_mm_embed = gather(manager, *args, **kwargs)
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
        encoder_rows = encoder_rows.reshape(-1, encoder_rows.shape[-1])  # a tiled output's tiles, in order
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
