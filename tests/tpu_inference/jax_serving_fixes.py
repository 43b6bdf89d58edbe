"""Under the JAX venv: each serving fix (aotc/runners/tpu_inference/serving_fixes/) against the tpu-inference
code it replaces, over random inputs: Qwen2.5-VL's M-RoPE positions (prompts of text, images and videos), its
image encoder inputs (encoder batches of one to four images), and MultiModalManager.gather_mm_embeddings with
the embedding padding after it (steps of random prefill chunks through prompts with images), and with dynamic
image sizes the padded encoder's inputs and its image rows (random grids); Gemma 4's encoder inputs (batches
of images at one or several soft-token budgets); Llama Guard 4's (batches of images of 1 to 5 tiles); LLaVA's on
the torchax path (vLLM's merge over the same steps, encoder batches of one to four images).

stdin: {"config": model dir, "cases": n, "padded_cases": m, "seed": s}
stdout (last line): {"mrope": [mismatching cases], "images": [...], "gather": [...], "padded_images": [...],
                     "gemma4_images": [...], "llama_guard_4_images": [...], "torchax_merge": [...],
                     "torchax_images": [...], "one_buffer_misplaced": count,
                     "cases": n, "gathered_pieces": count, "patch_buckets": count, "host_types": [...],
                     "patched": bool}
"""

from __future__ import annotations

import json
import os
import random
import sys
from types import SimpleNamespace

# Most of this script's time is XLA compiling the stack's eager ops (one compile per op per new shape), and most
# of that is LLVM optimising code that then runs once on a few hundred values. Optimisation level 0 keeps every
# HLO pass and changes how fast the compiled code runs, not what it computes (no fast-math either way), so every
# comparison below is as exact as before; it cut the compile time by about a third. Set before jax loads its
# backend, which reads XLA_FLAGS once.
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoConfig  # noqa: E402
from vllm.multimodal.inputs import (MultiModalFeatureSpec, MultiModalFieldElem, MultiModalKwargsItem,  # noqa: E402
                                    MultiModalSharedField, PlaceholderRange)

from aotc.runners.tpu_inference import serving_fixes  # noqa: E402
from aotc.runners.tpu_inference.serving_fixes import common as common_fix  # noqa: E402
from aotc.runners.tpu_inference.serving_fixes import gemma4 as gemma4_fix  # noqa: E402
from aotc.runners.tpu_inference.serving_fixes import llama_guard_4 as llama_guard_4_fix  # noqa: E402
from aotc.runners.tpu_inference.serving_fixes import llava as llava_fix  # noqa: E402
from aotc.runners.tpu_inference.serving_fixes import qwen2_5_vl as qwen2_5_vl_fix  # noqa: E402
from aotc.runners.tpu_inference.serving_fixes import qwen3_vl as qwen3_vl_fix  # noqa: E402
from aotc.runners.tpu_inference.serving_fixes import step_embeddings as step_embeddings_fix  # noqa: E402

MERGE, WIDTH = 2, 8


def item(**fields) -> MultiModalKwargsItem:
    return MultiModalKwargsItem({k: MultiModalFieldElem(data=v, field=MultiModalSharedField(batch_size=1))
                                 for k, v in fields.items()})


def random_prompt(rng: random.Random, config) -> tuple[list[int], list]:
    merge = config.vision_config.spatial_merge_size
    tokens, features = [rng.randrange(500) for _ in range(rng.randint(0, 20))], []
    for i in range(rng.randint(0, 3)):
        video = rng.random() < 0.3
        t, h, w = (rng.choice([2, 4]) if video else 1), merge * rng.randint(1, 8), merge * rng.randint(1, 8)
        n = t * h * w // merge ** 2
        tokens.append(config.vision_start_token_id)
        offset = len(tokens)
        tokens += [config.video_token_id if video else config.image_token_id] * n + [config.vision_end_token_id]
        tokens += [rng.randrange(500) for _ in range(rng.randint(0, 20))]
        # no second_per_grid_ts: tpu-inference 0.32 multiplies a jax array by its torch tensor and fails
        data = item(**{"video_grid_thw" if video else "image_grid_thw": torch.tensor([t, h, w])})
        features.append(MultiModalFeatureSpec(data=data, modality="video" if video else "image", identifier=str(i),
                                              mm_position=PlaceholderRange(offset=offset, length=n)))
    return tokens or [1], features


def check_mrope(rng, config, cases, stack) -> tuple[list, set]:
    model, mismatches, types = SimpleNamespace(config=config), [], set()
    for case in range(cases):
        tokens, features = random_prompt(rng, config)
        theirs, their_delta = stack.get_mrope_input_positions(model, tokens, features)
        ours, delta = qwen2_5_vl_fix.host_mrope_input_positions(model, tokens, features)
        types.add(type(ours).__module__)
        if not (np.array_equal(np.asarray(theirs), ours) and their_delta == delta and ours.dtype == np.int32):
            mismatches.append({"case": case, "tokens": len(tokens), "media": [f.modality for f in features]})
    return mismatches, types


class FakeVisionModel:
    """The two things the image path asks of the model: its merge size, and an embedding per image that
    depends on that image's pixels alone (summed per merged patch, as the real merger groups them)."""

    visual = SimpleNamespace(config=SimpleNamespace(spatial_merge_size=MERGE))

    def __init__(self, stack):
        self._validate_and_reshape_mm_tensor = lambda value, name: stack._validate_and_reshape_mm_tensor(self, value, name)

    def get_single_image_embedding(self, pixels, grid):
        t, h, w = grid
        return jnp.asarray(pixels).reshape(t * h * w // MERGE ** 2, MERGE ** 2, -1).sum(axis=1)


def check_images(rng, cases, stack) -> list:
    model, mismatches = FakeVisionModel(stack), []
    parse, process = qwen2_5_vl_fix._pixels_on_host(stack._parse_and_validate_image_input), qwen2_5_vl_fix._each_image_alone(
        stack._process_image_input)
    for case in range(cases):
        grids = tuple((1, MERGE * rng.randint(1, 4), MERGE * rng.randint(1, 4)) for _ in range(rng.randint(1, 4)))
        rows = [np.asarray(rng.random(), np.float32) * np.arange(t * h * w * 6, dtype=np.float32).reshape(t * h * w, 6)
                for t, h, w in grids]
        pixels = rng.choice([np.concatenate(rows), rows, np.concatenate(rows)[None]])
        theirs = stack._process_image_input(model, stack._parse_and_validate_image_input(
            model, pixel_values=pixels, image_grid_thw=grids))
        ours = process(model, parse(model, pixel_values=pixels, image_grid_thw=grids))
        if len(theirs) != len(ours) or not all(np.array_equal(a, b) for a, b in zip(theirs, ours)):
            mismatches.append({"case": case, "grids": grids})
    return mismatches


class FakeGemma4Model:
    """What Gemma 4's image path asks of the model: a mesh (one device, every axis the stack may shard the
    encoder batch on), and an encoder whose rows for an image depend on that image's patches and positions alone,
    padded positions masked out (as the real tower's input mask does)."""

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1, 1), ("data", "attn_dp", "attn_dp_expert",
                                                                               "model"))

    def get_single_image_embedding(self, pixels, positions):
        valid = (positions[..., :1] >= 0).astype(jnp.float32)
        return pixels.astype(jnp.float32) * valid + positions.sum(axis=-1, keepdims=True).astype(jnp.float32)


def check_gemma4_images(rng, cases, gemma4) -> list:
    """Encoder batches of one to three images, as vLLM hands them over: one bf16 tensor when the images share a
    soft-token budget, a list when they do not (the stack fails on that one). Each image's rows from ours equal
    the stack's for that image alone, and the stack's for the whole batch where it takes it."""
    stack, model, mismatches = gemma4.Gemma4ForConditionalGeneration, FakeGemma4Model(), []
    parse, process = gemma4_fix._gemma4_pixels_on_host(stack._parse_and_validate_image_input), \
        gemma4_fix._each_image_alone_on_host(stack._process_image_input)
    theirs = lambda pixels, positions: stack._process_image_input(model, stack._parse_and_validate_image_input(
        model, pixel_values=pixels, pixel_position_ids=positions))
    for case in range(cases):
        budgets = [rng.choice([4, 8]) for _ in range(rng.randint(1, 3))]
        pixels = [torch.randn(n, 6).to(torch.bfloat16) for n in budgets]
        positions = [torch.cat([torch.randint(0, 9, (n - 1, 2)), torch.full((1, 2), -1)]) for n in budgets]
        shared = len(set(budgets)) == 1
        batch = (torch.stack(pixels), torch.stack(positions)) if shared else (pixels, positions)
        ours = process(model, parse(model, pixel_values=batch[0], pixel_position_ids=batch[1]))
        alone = [row for p, q in zip(pixels, positions) for row in theirs(p[None], q[None])]
        whole = theirs(*batch) if shared else alone
        if not (len(ours) == len(alone) == len(whole)
                and all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in zip(ours, alone, whole))):
            mismatches.append({"case": case, "budgets": budgets})
    return mismatches


class FakeLlamaGuard4Model:
    """What Llama Guard 4's image path asks of the model: a vision tower and projector whose rows for a tile depend
    on that tile's pixels alone (NHWC in, as the stack hands them over: 2 x 2 pixels, 2 rows of 6 a tile), and the
    jitted pair of them the fix runs per image."""

    @staticmethod
    def vision_model(tiles):
        return tiles.reshape(tiles.shape[0], -1, 6).astype(jnp.float32) * 2

    @staticmethod
    def multi_modal_projector(features):
        return features + 1

    _compute_vision_features_jit = staticmethod(jax.jit(lambda tiles: FakeLlamaGuard4Model.multi_modal_projector(
        FakeLlamaGuard4Model.vision_model(tiles))))


def check_llama_guard_4_images(rng, cases, llama_guard_4) -> list:
    """Encoder batches of one to three images of 1, 3, 4 or 5 tiles, as vLLM hands them over (the batch's tiles
    as one NCHW bf16 tensor, the tile counts as a tensor or a list): each image's rows from ours, flattened, equal
    what the stack's embed_multimodal returns for it, and the shape the runner sees is the stack's."""
    stack, model, mismatches = llama_guard_4.LlamaGuard4ForCausalLM, FakeLlamaGuard4Model(), []
    ours = llama_guard_4_fix._each_image_by_its_tiles(stack.embed_multimodal)
    for case in range(cases):
        counts = [rng.choice([1, 3, 4, 5]) for _ in range(rng.randint(1, 3))]
        pixels = torch.randn(sum(counts), 3, 2, 2).to(torch.bfloat16)
        per_image = torch.tensor(counts) if case % 2 else [[n] for n in counts]
        theirs = stack.embed_multimodal(model, pixel_values=pixels, patches_per_image=per_image)
        mine = ours(model, pixel_values=pixels, patches_per_image=per_image)
        if not (len(mine) == len(theirs) == len(counts)
                and all(isinstance(m, common_fix.WholeEncoderOutput) and m.shape == t.shape
                        and np.array_equal(np.asarray(m.array).reshape(m.shape), np.asarray(t))
                        for m, t in zip(mine, theirs))):
            mismatches.append({"case": case, "tiles": counts})
    return mismatches


def stack_vision(qwen2_5_vl, head_dim: int, window_size: int):
    """The stack's Qwen2_5_VisionTransformer methods that build the padded encoder's inputs, over the
    attributes they read (a real tower's sizes, no weights); its padded encoder a stand-in that depends on
    every input (the merged rows in window order, scaled by the rotary table and the sequence bounds)."""
    import types

    cls = qwen2_5_vl.Qwen2_5_VisionTransformer
    visual = SimpleNamespace(spatial_merge_size=MERGE, spatial_merge_unit=MERGE ** 2, window_size=window_size,
                             patch_size=14, enable_dynamic_image_sizes=True,
                             rotary_pos_emb=qwen2_5_vl.Qwen2_5_VisionRotaryEmbedding(head_dim // 2))
    for name in ("rotary_pos_emb_thw", "get_window_index_thw", "get_rope_by_thw", "compute_aux_arrays",
                 "pad_inputs", "__call__"):
        setattr(visual, name, types.MethodType(getattr(cls, name), visual))

    @jax.jit
    def encode_padded(x, window_index, rotary, cu_seqlens, cu_window_seqlens):
        merged = x.astype(jnp.float32).reshape(-1, MERGE ** 2, x.shape[-1]).sum(axis=1)[window_index]
        scale = rotary.astype(jnp.float32).reshape(merged.shape[0], -1).sum(axis=1, keepdims=True)
        return merged * (1 + scale) + cu_seqlens.sum() + cu_window_seqlens.sum()

    visual.encode_padded_jit = encode_padded
    return visual


def check_padded_images(rng, cases, qwen2_5_vl) -> tuple[list, int]:
    """Random grids (one image, as the stack's get_single_image_embedding hands them over, and several for
    the aux arrays): the host inputs equal the stack's compute_aux_arrays + pad_inputs, array for array and
    dtype for dtype, and the padded output's image rows equal the stack's sliced output."""
    mismatches, buckets = [], set()
    for case in range(cases):
        head_dim, window = rng.choice([(16, 112), (80, 112), (64, 56)])
        visual = stack_vision(qwen2_5_vl, head_dim, window)
        grids = tuple((1, MERGE * rng.randint(1, 16), MERGE * rng.randint(1, 16)) for _ in range(rng.randint(1, 3)))
        theirs_aux = visual.compute_aux_arrays(grids)
        ours_aux = qwen2_5_vl_fix.host_aux_arrays(visual, grids)
        grid = grids[:1]
        patches = int(np.prod(grid[0]))
        x = np.asarray(np.random.default_rng(case).normal(size=(patches, 6)), jnp.bfloat16)
        theirs_inputs = visual.pad_inputs(jnp.asarray(x), *visual.compute_aux_arrays(grid))
        ours_inputs, count = qwen2_5_vl_fix.host_padded_encoder_inputs(visual, x, grid)
        theirs_rows = visual.__call__(jnp.asarray(x), grid)
        ours_rows = qwen2_5_vl_fix.padded_image_embedding(visual, x, grid[0])
        buckets.add(ours_inputs[0].shape[0])
        same = (all(same_array(a, b) for a, b in zip(ours_aux, theirs_aux))
                and all(same_array(a, b) for a, b in zip(ours_inputs, theirs_inputs[:5]))
                and count == theirs_inputs[5] and ours_rows.shape == theirs_rows.shape
                and np.array_equal(np.asarray(ours_rows.array)[:count], np.asarray(theirs_rows)))
        if not same:
            mismatches.append({"case": case, "grids": grids, "head_dim": head_dim, "window": window})
    return mismatches, len(buckets)


def same_array(ours, theirs) -> bool:
    return ours.shape == theirs.shape and ours.dtype == theirs.dtype and np.array_equal(ours, np.asarray(theirs))


def random_step(rng):
    """Requests with images at random places, each scheduled a random chunk of what it has left."""
    rows = rng.choice([16, 32, 64])
    requests, scheduled, cache, left = {}, {}, {}, rows
    for r in range(rng.randint(1, 4)):
        features, length = [], rng.randint(1, 6)
        for i in range(rng.randint(0, 2)):
            n = rng.choice([4, 12])
            features.append(MultiModalFeatureSpec(data=None, modality="image", identifier=f"{r}-{i}",
                                                  mm_position=PlaceholderRange(offset=length + 1, length=n)))
            cache[f"{r}-{i}"] = jnp.asarray(np.random.default_rng(rng.randrange(1 << 30)).normal(size=(n, WIDTH)),
                                            jnp.bfloat16)
            length += n + 2 + rng.randint(0, 6)
        computed = rng.randint(0, length - 1)
        if left < 1:
            break
        scheduled[f"r{r}"] = rng.randint(1, min(left, length - computed))
        left -= scheduled[f"r{r}"]
        requests[f"r{r}"] = SimpleNamespace(num_computed_tokens=computed, mm_features=features)
    return rows, requests, scheduled, cache


def gather_call(rng, mesh):
    """A random step (random_step) as gather_mm_embeddings is called on it: rows, scheduled, encoder cache, the
    manager (its runner a JAX model's: no embed_input_ids_fn marked to keep its pieces) and the call's arguments."""
    rows, requests, scheduled, cache = random_step(rng)
    manager = SimpleNamespace(runner=SimpleNamespace(requests=requests, encoder_cache=cache, mesh=mesh,
                                                     embed_input_ids_fn=None))
    output, ids = SimpleNamespace(num_scheduled_tokens=scheduled), {0: list(scheduled)}
    return rows, scheduled, cache, manager, (output, rows, ids, rows)


def same_buffer(ours, theirs, rows: int, flatten_pad) -> bool:
    """The fix's gather (one buffer, the mask) equals the stack's (its pieces flattened and padded to the step's
    rows, the mask), or both gathered nothing."""
    (buffers, mask), (their_pieces, their_mask) = ours, theirs
    if their_pieces is None:
        return buffers is None and mask is None
    padded = flatten_pad(their_pieces, target_pad_len=rows)
    return (len(buffers) == 1 and same_array(np.asarray(buffers[0]), padded)
            and np.array_equal(np.asarray(mask), np.asarray(their_mask)))


def check_gather(rng, cases, gather, flatten_pad) -> tuple[list, int]:
    mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)  # as the runner's
    ours_gather, mismatches, pieces = step_embeddings_fix._into_one_buffer(gather), [], 0
    for case in range(cases):
        rows, scheduled, cache, manager, args = gather_call(rng, mesh)
        their_pieces, their_mask = gather(manager, *args)
        pieces += len(their_pieces or [])
        same = same_buffer(ours_gather(manager, *args), (their_pieces, their_mask), rows, flatten_pad)
        if not same or manager.runner.encoder_cache is not cache:
            mismatches.append({"case": case, "rows": rows, "scheduled": scheduled})
    return mismatches, pieces


def to_torch(array) -> torch.Tensor:
    return torch.from_numpy(np.asarray(array, np.float32))


def check_torchax_merge(rng, cases, gather) -> tuple[list, int]:
    """Steps of random prefill chunks through prompts with images (random_step): vLLM's own
    _merge_multimodal_embeddings over the pieces the stack's gather_mm_embeddings cuts equals, row for row,
    merge_rows_in_order over the same pieces and, traced by jax.jit under torchax as the fix runs it, over the
    one buffer of the fix's gather. And vLLM's merge run eagerly under torchax, as the stack runs it for other
    vLLM models, misplaces that buffer's rows: torchax writes a boolean-mask assignment whose values have the
    target's shape row for row (buffer row i to position i), so the fix leaves those models their pieces."""
    import torchax
    from torchax.interop import jax_view, torch_view
    from tpu_inference.models.vllm.experimental.qwen3_vl_patcher import (
        _patched_merge_multimodal_embeddings as qwen3_vl_merge)
    from vllm.model_executor.models.utils import _merge_multimodal_embeddings as vllms_merge

    @jax.jit
    def merged_in_jit(embeds, buffer, mask):
        with torchax.default_env():
            return jax_view(llava_fix.merge_rows_in_order(torch_view(embeds), [torch_view(buffer)], torch_view(mask)))

    mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    ours_gather, mismatches, misplaced = step_embeddings_fix._into_one_buffer(gather), [], 0
    for case in range(cases):
        rows, scheduled, _, manager, args = gather_call(rng, mesh)
        pieces, mask = gather(manager, *args)
        if pieces is None:
            continue
        [buffer], _ = ours_gather(manager, *args)
        embeds, torch_mask = torch.randn(rows, WIDTH), torch.from_numpy(np.asarray(mask))
        theirs = vllms_merge(embeds.clone(), [to_torch(p) for p in pieces], torch_mask)
        in_order = llava_fix.merge_rows_in_order(embeds.clone(), [to_torch(p) for p in pieces], torch_mask)
        in_jit = np.asarray(merged_in_jit(jnp.asarray(embeds.numpy()), buffer.astype(jnp.float32), mask))
        with torchax.default_env():
            eager = jax_view(vllms_merge(torch_view(jnp.asarray(embeds.numpy())),
                                         [torch_view(buffer.astype(jnp.float32))], torch_view(mask)))
            # Qwen3-VL's module holds the stack's merge (qwen3_vl_patcher), which the fix's jit keeps
            qwen3_vl = np.asarray(jax_view(qwen3_vl_merge(torch_view(jnp.asarray(embeds.numpy())),
                                                          [torch_view(buffer.astype(jnp.float32))], torch_view(mask))))
        if not (torch.equal(theirs, in_order) and np.array_equal(theirs.numpy(), in_jit)
                and np.array_equal(theirs.numpy(), qwen3_vl)):
            mismatches.append({"case": case, "rows": rows, "scheduled": scheduled})
        misplaced += not np.array_equal(theirs.numpy(), np.asarray(eager))
    return mismatches, misplaced


class LlavaForConditionalGeneration:
    """A stand-in vLLM model: its class name and tower type are what the fixes read."""

    config = SimpleNamespace(vision_config=SimpleNamespace(model_type="clip_vision_model"))


class Qwen3VLForConditionalGeneration:
    """A stand-in vLLM model: its tower runs through the stack's MMEncoderJITManager, its merge in the fix's jit."""

    config = SimpleNamespace(vision_config=SimpleNamespace(model_type="qwen3_vl"))


class Qwen3VLMoeForConditionalGeneration(Qwen3VLForConditionalGeneration):
    """A stand-in of Qwen3-VL MoE's vLLM model (a subclass of Qwen3-VL's that changes its text model only)."""


class Qwen3_5ForConditionalGeneration:
    """A stand-in of Qwen3.5's vLLM model, in its module: its embed_input_ids calls the merge that module imported
    from vLLM."""

    __module__ = "vllm.model_executor.models.qwen3_5"
    config = SimpleNamespace(vision_config=SimpleNamespace(model_type="qwen3_5"))


def qwen3_5_merge_takes_the_one_buffer_in_order() -> bool:
    """An embed_input_ids calling Qwen3.5's module's merge, as Qwen3.5's does: jitted by the fix, the step's one
    buffer (as many rows as the step's padded tokens, target_pad_len; rows past the placeholders' are padding) lands
    row i at placeholder i; jitted as it is, vLLM's boolean-mask merge writes buffer row i to position i (torchax, a
    value as long as the target); the module holds vLLM's merge again after the trace."""
    import torchax
    import vllm.model_executor.models.qwen3_5 as qwen3_5
    import vllm.model_executor.models.utils as vllm_model_utils
    from torchax.interop import jax_view, torch_view

    def stock_embed(wrapper):
        def embed(params_and_buffers, input_ids, mm_embeds=None, *, is_multimodal=None):
            with torchax.default_env():
                text = torch_view(jnp.zeros((input_ids.shape[0], 4), jnp.float32))
                return jax_view(qwen3_5._merge_multimodal_embeddings(text, [torch_view(mm_embeds)],
                                                                     torch_view(is_multimodal)))
        return embed

    wrapper = SimpleNamespace(model=SimpleNamespace(vllm_model=Qwen3_5ForConditionalGeneration()))
    placeholders, mask = [2, 3, 6], np.zeros(8, bool)
    mask[placeholders] = True
    buffer = np.arange(8 * 4, dtype=np.float32).reshape(8, 4) + 1  # 3 placeholders' rows, then 5 of padding
    expected = np.zeros((8, 4), np.float32)
    expected[placeholders] = buffer[:3]
    step = (None, jnp.zeros(8, jnp.int32), jnp.asarray(buffer))
    ours = np.asarray(llava_fix._merged_in_one_jit(stock_embed)(wrapper)(*step, is_multimodal=jnp.asarray(mask)))
    try:
        as_is = np.asarray(jax.jit(stock_embed(wrapper))(*step, is_multimodal=jnp.asarray(mask)))
    except Exception:  # noqa: BLE001 - a merge that cannot take the buffer at all is as wrong as a misplaced one
        as_is = None
    return (np.array_equal(ours, expected) and not np.array_equal(as_is, expected)
            and qwen3_5._merge_multimodal_embeddings is vllm_model_utils._merge_multimodal_embeddings)


def batch_tower(params_and_buffers, modality=None, **kwargs):
    """The stack's embed_multimodal_fn on the torchax path, stood in: each image's rows (2 x 2 pixels, 2 rows of 6)
    depend on its own pixels alone, the batch's embeddings one (images, tokens, width) array."""
    pixels = kwargs["pixel_values"]
    pixels = torch.stack(list(pixels)) if isinstance(pixels, list) else pixels
    return jnp.asarray(pixels.float().numpy()).reshape(pixels.shape[0], 2, 6) * 2 + 1


def check_torchax_images(rng, cases) -> list:
    """Encoder batches of one to four LLaVA images (one tensor, or a list of images): each image alone through the
    tower gives the rows the stack's batch gives it, as a (tokens, width) output to the runner; a vLLM model
    the fixes do not jit keeps the stack's functions (its embed_input_ids marked to keep its pieces)."""
    llava = SimpleNamespace(model=SimpleNamespace(vllm_model=LlavaForConditionalGeneration()))
    other = SimpleNamespace(model=SimpleNamespace(vllm_model=SimpleNamespace(config=llava.model.vllm_model.config)))
    qwen3_vl, qwen3_vl_moe = (SimpleNamespace(model=SimpleNamespace(vllm_model=cls())) for cls in (
        Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration))
    encode = llava_fix._each_image_through_the_jitted_tower(lambda wrapper: batch_tower)(llava)
    mismatches = []
    for case in range(cases):
        count = rng.randint(1, 4)
        pixels = torch.randn(count, 3, 2, 2).to(torch.bfloat16)
        sent = list(pixels) if case % 2 else pixels
        theirs, ours = batch_tower(None, modality="image", pixel_values=pixels), encode(None, modality="image",
                                                                                        pixel_values=sent)
        if not (len(ours) == count and all(
                isinstance(o, common_fix.WholeEncoderOutput) and o.shape == t.shape and o.ndim == 2
                and np.array_equal(np.asarray(o.array).reshape(o.shape), np.asarray(t)) for o, t in zip(ours, theirs))):
            mismatches.append({"case": case, "images": count})

    def stock_embed(*args, **kwargs):
        return None

    kept = (llava_fix._each_image_through_the_jitted_tower(lambda wrapper: batch_tower)(other) is batch_tower
            and llava_fix._merged_in_one_jit(lambda wrapper: stock_embed)(other) is stock_embed
            and getattr(stock_embed, llava_fix.TAKES_ONE_BUFFER) is False
            and llava_fix._jit_planned_towers(lambda fn, model: "stack's")(batch_tower, other.model.vllm_model) == "stack's"
            and hasattr(llava_fix._jit_planned_towers(lambda fn, model: None)(batch_tower, llava.model.vllm_model), "lower")
            and hasattr(llava_fix._merged_in_one_jit(lambda wrapper: stock_embed)(llava), "lower")
            and all(llava_fix._each_image_through_the_jitted_tower(lambda wrapper: batch_tower)(qwen3) is batch_tower
                    and llava_fix._jit_planned_towers(lambda fn, model: "stack's")(batch_tower, qwen3.model.vllm_model)
                    == "stack's"
                    and hasattr(llava_fix._merged_in_one_jit(lambda wrapper: stock_embed)(qwen3), "lower")
                    for qwen3 in (qwen3_vl, qwen3_vl_moe)))
    if not kept:
        mismatches.append({"case": "which models the fixes jit"})
    if not deepstack_rows_left_behind_by_no_trace(qwen3_vl):
        mismatches.append({"case": "Qwen3-VL deepstack rows kept across traces"})
    if not qwen3_5_merge_takes_the_one_buffer_in_order():
        mismatches.append({"case": "Qwen3.5's merge over the one buffer"})
    return mismatches


def deepstack_rows_left_behind_by_no_trace(wrapper) -> bool:
    """The stack's Qwen3-VL patches keep a step's deepstack rows on the model and pack whatever is there: the fix's
    jitted embed_input_ids traces from none (not an earlier step's) and leaves none behind (no tracer outlives its
    trace)."""
    model, seen = wrapper.model.vllm_model, []
    model.use_deepstack, model._deepstack_tensors = True, {"deepstack_input_embeds_0": "an earlier step's rows"}

    def keeps_rows(params_and_buffers, input_ids, mm_embeds=None, *, is_multimodal=None):
        seen.append(dict(model._deepstack_tensors))
        model._deepstack_tensors["deepstack_input_embeds_0"] = input_ids  # what _patched_set_deepstack does
        return input_ids

    embed = llava_fix._merged_in_one_jit(lambda _: keeps_rows)(wrapper)
    embed(None, jnp.zeros(4, jnp.int32))
    return seen == [{}] and model._deepstack_tensors == {}


def budget_batches(rng, cache: dict) -> list[tuple[list[str], int]]:
    """The step's images packed into encoder batches of one to three, each batch's output a token budget's rows."""
    keys, batches = list(cache), []
    while keys:
        size = rng.randint(1, 3)
        batch, keys = keys[:size], keys[size:]
        batches.append((batch, sum(cache[k].shape[0] for k in batch) + rng.choice([0, 3, 16])))
    return batches


def check_budget_outputs(rng, cases, gather, flatten_pad, stack_postprocess) -> tuple[list, int]:
    """Steps of random prefill chunks (random_step) whose images were encoded in token-budget batches (one to three
    images, each batch's output the budget's rows, padding after them): the stack's MMEncoderJITManager postprocess
    slices each image's rows on the device, and its gather cuts and pads the step's pieces; the fix keeps each
    budget output whole with its image's place in it, and its gather builds the same buffer from there."""
    mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    ours_gather, mismatches, shared = step_embeddings_fix._into_one_buffer(gather), [], 0
    for case in range(cases):
        rows, scheduled, cache, manager, args = gather_call(rng, mesh)
        theirs_cache, ours_cache = {}, {}
        for batch, budget in budget_batches(rng, cache):
            counts = [cache[k].shape[0] for k in batch]
            output = jnp.concatenate([cache[k] for k in batch]
                                     + [jnp.ones((budget - sum(counts), WIDTH), jnp.bfloat16)])
            theirs_out, ours_out = [None] * len(batch), [None] * len(batch)
            stack_postprocess(None, output, list(range(len(batch))), counts, theirs_out)
            qwen3_vl_fix._whole_budget_outputs(None, output, list(range(len(batch))), counts, ours_out)
            theirs_cache.update(zip(batch, theirs_out))
            ours_cache.update(zip(batch, ours_out))
            shared += len(batch) > 1
        manager.runner.encoder_cache = theirs_cache
        their_pieces, their_mask = gather(manager, *args)
        manager.runner.encoder_cache = ours_cache
        if not same_buffer(ours_gather(manager, *args), (their_pieces, their_mask), rows, flatten_pad):
            mismatches.append({"case": case, "rows": rows, "scheduled": scheduled})
    return mismatches, shared


def main() -> None:
    request = json.loads(sys.stdin.read())
    from tpu_inference.models.jax import qwen2_5_vl
    from tpu_inference.models.jax.utils.multi_modal_utils import flatten_pad_mm_embeds
    from tpu_inference.runner import multimodal_manager

    stack = qwen2_5_vl.Qwen2_5_VLForConditionalGeneration
    originals = {name: getattr(stack, name) for name in ("get_mrope_input_positions", "_parse_and_validate_image_input",
                                                         "_process_image_input", "_validate_and_reshape_mm_tensor")}
    stack_model = SimpleNamespace(**originals)
    gather = multimodal_manager.MultiModalManager.gather_mm_embeddings
    rng, cases = random.Random(request["seed"]), request["cases"]
    mrope, types = check_mrope(rng, AutoConfig.from_pretrained(request["config"]), cases, stack_model)
    images = check_images(rng, cases, stack_model)
    gathered, pieces = check_gather(rng, cases, gather, flatten_pad_mm_embeds)
    padded, patch_buckets = check_padded_images(rng, request["padded_cases"], qwen2_5_vl)
    from tpu_inference.models.jax import gemma4_mm

    gemma4_originals = {"_process_image_input": gemma4_mm.Gemma4ForConditionalGeneration._process_image_input}
    gemma4_images = check_gemma4_images(rng, request["padded_cases"], gemma4_mm)
    from tpu_inference.models.jax import llama_guard_4

    guard_embed = llama_guard_4.LlamaGuard4ForCausalLM.embed_multimodal
    llama_guard_4_images = check_llama_guard_4_images(rng, request["padded_cases"], llama_guard_4)
    torchax_merge, misplaced = check_torchax_merge(rng, cases, gather)
    torchax_images = check_torchax_images(rng, request["padded_cases"])
    from tpu_inference.runner import mm_encoder_jit_manager

    adapter = mm_encoder_jit_manager._TorchaxEncoderModelAdapter
    budget_outputs, shared_budgets = check_budget_outputs(rng, cases, gather, flatten_pad_mm_embeds,
                                                          adapter.postprocess_encoder_output)
    from tpu_inference.models.vllm import vllm_model_wrapper

    wrapper_embed = vllm_model_wrapper.VllmModelWrapper.wrap_embed_input_ids_func
    serving_fixes.install()
    serving_fixes.install()  # twice: still one layer of fixes
    patched = (stack.get_mrope_input_positions is qwen2_5_vl_fix.host_mrope_input_positions
               and stack._process_image_input.__wrapped__ is originals["_process_image_input"]
               and multimodal_manager.MultiModalManager.gather_mm_embeddings.__wrapped__ is gather
               and gemma4_mm.Gemma4ForConditionalGeneration._process_image_input.__wrapped__
               is gemma4_originals["_process_image_input"]
               and llama_guard_4.LlamaGuard4ForCausalLM.embed_multimodal.__wrapped__ is guard_embed
               and vllm_model_wrapper.VllmModelWrapper.wrap_embed_input_ids_func.__wrapped__ is wrapper_embed
               and adapter.postprocess_encoder_output is qwen3_vl_fix._whole_budget_outputs)
    print(json.dumps({"cases": cases, "mrope": mrope, "images": images, "gather": gathered, "gathered_pieces": pieces,
                      "padded_images": padded, "gemma4_images": gemma4_images,
                      "llama_guard_4_images": llama_guard_4_images, "torchax_merge": torchax_merge,
                      "one_buffer_misplaced": misplaced, "torchax_images": torchax_images,
                      "budget_outputs": budget_outputs, "shared_budgets": shared_budgets,
                      "patch_buckets": patch_buckets, "host_types": sorted(types), "patched": patched}))


if __name__ == "__main__":
    main()
