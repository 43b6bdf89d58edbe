"""LLaVA (vLLM's PyTorch model, on tpu-inference's torchax path), and the merge in one jit that Qwen3-VL and
its kin share (qwen3_vl.JITTED_TORCHAX_MERGES_ONLY).

The wrapper runs vLLM's embed_input_ids unjitted ("cannot be JITted directly due to its dynamic
implementation": vLLM's merge writes the images' rows through a boolean mask, `inputs_embeds[is_multimodal] =
rows`, whose row count is data-dependent) and the vision tower and projector as eager torchax ops over an
encoder batch: every step with images compiles op by op, keyed by the step's image tokens, and every batch by
its image count. The fix jits embed_input_ids whole, with vLLM's merge taking the one buffer's rows in order
(row i to the i-th placeholder, the gather tpu-inference's JAX models merge with), and runs each image through
the jitted tower alone (one pixel shape: the processor resizes every image to the tower's size). Other vLLM
multimodal models keep the stack's own functions and gather_mm_embeddings' own pieces: vLLM's merge, run
eagerly under torchax, writes a buffer as long as the step row for row (buffer row i to position i),
misplacing its rows.
"""

from __future__ import annotations

import contextlib
import functools

from .common import WholeEncoderOutput, attribute_set, wrap_once
from .qwen3_vl import JITTED_TORCHAX_MERGES_ONLY, no_deepstack_rows_kept

# vLLM models on the torchax path whose tower the fixes jit (planned by aotc/runners/tpu_inference/plan/buckets.py)
JITTED_TORCHAX_TOWERS = frozenset({"LlavaForConditionalGeneration"})
# set False on an embed_input_ids_fn whose merge needs gather_mm_embeddings' own pieces (step_embeddings)
TAKES_ONE_BUFFER = "_aotc_takes_one_buffer"


def fix(module) -> None:
    wrap_once(module, maybe_jit_embed_multimodal_func=_jit_planned_towers)
    wrap_once(module.VllmModelWrapper, wrap_embed_multimodal_func=_each_image_through_the_jitted_tower,
              wrap_embed_input_ids_func=_merged_in_one_jit)


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
            with _vllm_merge_swapped(vllm_model), no_deepstack_rows_kept(vllm_model):
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
