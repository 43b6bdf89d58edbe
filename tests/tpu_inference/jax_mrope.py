"""Under the JAX venv: the host M-RoPE positions (aotc/runners/tpu_inference/serving_fixes.py) against
tpu-inference's own Qwen2.5-VL get_mrope_input_positions, over random prompts of text, images and videos.

stdin: {"config": model dir, "cases": n, "seed": s}
stdout (last line): {"cases", "mismatches": [...], "host_types": [...], "patched": bool}
"""

from __future__ import annotations

import json
import random
import sys
from types import SimpleNamespace

import numpy as np
import torch
from transformers import AutoConfig
from vllm.multimodal.inputs import (MultiModalFeatureSpec, MultiModalFieldElem, MultiModalKwargsItem,
                                    MultiModalSharedField, PlaceholderRange)


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


def main() -> None:
    request = json.loads(sys.stdin.read())
    from tpu_inference.models.jax import qwen2_5_vl

    from aotc.runners.tpu_inference import serving_fixes

    stacks = qwen2_5_vl.Qwen2_5_VLForConditionalGeneration.get_mrope_input_positions
    model = SimpleNamespace(config=AutoConfig.from_pretrained(request["config"]))
    rng, mismatches, types = random.Random(request["seed"]), [], set()
    for case in range(request["cases"]):
        tokens, features = random_prompt(rng, model.config)
        theirs, their_delta = stacks(model, tokens, features)
        ours, delta = serving_fixes.host_mrope_input_positions(model, tokens, features)
        types.add(type(ours).__module__)
        if not (np.array_equal(np.asarray(theirs), ours) and their_delta == delta and ours.dtype == np.int32):
            mismatches.append({"case": case, "tokens": len(tokens), "media": [f.modality for f in features]})
    serving_fixes.install()
    patched = qwen2_5_vl.Qwen2_5_VLForConditionalGeneration.get_mrope_input_positions is \
        serving_fixes.host_mrope_input_positions
    print(json.dumps({"cases": request["cases"], "mismatches": mismatches, "host_types": sorted(types),
                      "patched": patched}))


if __name__ == "__main__":
    main()
