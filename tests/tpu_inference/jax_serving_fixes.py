"""Under the JAX venv: each serving fix (aotc/runners/tpu_inference/serving_fixes.py) against the tpu-inference
code it replaces, over random inputs: Qwen2.5-VL's M-RoPE positions (prompts of text, images and videos), its
image encoder inputs (encoder batches of one to four images), and MultiModalManager.gather_mm_embeddings with
the embedding padding after it (steps of random prefill chunks through prompts with images).

stdin: {"config": model dir, "cases": n, "seed": s}
stdout (last line): {"mrope": [mismatching cases], "images": [...], "gather": [...], "cases": n,
                     "gathered_pieces": count, "host_types": [...], "patched": bool}
"""

from __future__ import annotations

import json
import random
import sys
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import torch
from transformers import AutoConfig
from vllm.multimodal.inputs import (MultiModalFeatureSpec, MultiModalFieldElem, MultiModalKwargsItem,
                                    MultiModalSharedField, PlaceholderRange)

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


def check_mrope(rng, config, cases, fixes, stack) -> tuple[list, set]:
    model, mismatches, types = SimpleNamespace(config=config), [], set()
    for case in range(cases):
        tokens, features = random_prompt(rng, config)
        theirs, their_delta = stack.get_mrope_input_positions(model, tokens, features)
        ours, delta = fixes.host_mrope_input_positions(model, tokens, features)
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


def check_images(rng, cases, fixes, stack) -> list:
    model, mismatches = FakeVisionModel(stack), []
    parse, process = fixes._pixels_on_host(stack._parse_and_validate_image_input), fixes._each_image_alone(
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


def check_gather(rng, cases, fixes, gather, flatten_pad) -> tuple[list, int]:
    mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)  # as the runner's
    ours_gather, mismatches, pieces = fixes._into_one_buffer(gather), [], 0
    for case in range(cases):
        rows, requests, scheduled, cache = random_step(rng)
        manager = SimpleNamespace(runner=SimpleNamespace(requests=requests, encoder_cache=cache, mesh=mesh))
        output, ids = SimpleNamespace(num_scheduled_tokens=scheduled), {0: list(scheduled)}
        their_pieces, their_mask = gather(manager, output, rows, ids, rows)
        ours, mask = ours_gather(manager, output, rows, ids, rows)
        if their_pieces is None:
            same = ours is None and mask is None
        else:
            pieces += len(their_pieces)
            theirs = flatten_pad(their_pieces, target_pad_len=rows)
            same = (len(ours) == 1 and ours[0].shape == theirs.shape and ours[0].dtype == theirs.dtype
                    and np.array_equal(np.asarray(ours[0]), np.asarray(theirs))
                    and np.array_equal(np.asarray(mask), np.asarray(their_mask)))
        if not same or manager.runner.encoder_cache is not cache:
            mismatches.append({"case": case, "rows": rows, "scheduled": scheduled})
    return mismatches, pieces


def main() -> None:
    request = json.loads(sys.stdin.read())
    from tpu_inference.models.jax import qwen2_5_vl
    from tpu_inference.models.jax.utils.multi_modal_utils import flatten_pad_mm_embeds
    from tpu_inference.runner import multimodal_manager

    from aotc.runners.tpu_inference import serving_fixes

    stack = qwen2_5_vl.Qwen2_5_VLForConditionalGeneration
    originals = {name: getattr(stack, name) for name in ("get_mrope_input_positions", "_parse_and_validate_image_input",
                                                         "_process_image_input", "_validate_and_reshape_mm_tensor")}
    stack_model = SimpleNamespace(**originals)
    gather = multimodal_manager.MultiModalManager.gather_mm_embeddings
    rng, cases = random.Random(request["seed"]), request["cases"]
    mrope, types = check_mrope(rng, AutoConfig.from_pretrained(request["config"]), cases, serving_fixes, stack_model)
    images = check_images(rng, cases, serving_fixes, stack_model)
    gathered, pieces = check_gather(rng, cases, serving_fixes, gather, flatten_pad_mm_embeds)
    serving_fixes.install()
    serving_fixes.install()  # twice: still one layer of fixes
    patched = (stack.get_mrope_input_positions is serving_fixes.host_mrope_input_positions
               and stack._process_image_input.__wrapped__ is originals["_process_image_input"]
               and multimodal_manager.MultiModalManager.gather_mm_embeddings.__wrapped__ is gather)
    print(json.dumps({"cases": cases, "mrope": mrope, "images": images, "gather": gathered, "gathered_pieces": pieces,
                      "host_types": sorted(types), "patched": patched}))


if __name__ == "__main__":
    main()
