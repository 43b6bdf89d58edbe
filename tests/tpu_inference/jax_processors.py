"""Under the JAX venv: what vLLM-TPU's own multimodal processors make of images, for the tiny vision models (one
process for all of them: each check only reads vLLM's processing code).

stdin: {"qwen": [model dir, [[max_model_len, mm_processor_kwargs], ...]],
        "gemma4": [model dir, max_model_len, [soft-token budgets], [[height, width], ...]],
        "llama_guard_4": [model dir, max_model_len, [[height, width], ...]]}
stdout (last line): {"qwen": [the largest image's tokens, per case],
                     "gemma4": {"most_tokens", "patches": {budget: [pixel_values shape, per size]},
                                "tokens": {budget: [image tokens, per size]}},
                     "llama_guard_4": {"most_tokens", "images": [[tiles, embedding rows, prompt tokens], per size]}}
"""

from __future__ import annotations

import json
import sys

from PIL import Image
from vllm.config import ModelConfig
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.encoder_budget import get_mm_max_toks_per_item


def most_image_tokens(processor) -> int:
    """The most tokens vLLM gives one image (what its encoder budget is sized by)."""
    return get_mm_max_toks_per_item(processor, {"image": 1}, None)["image"]


def qwen_largest_images(model: str, cases: list) -> list[int]:
    tokens = []
    for max_len, kwargs in cases:
        config = ModelConfig(model=model, max_model_len=max_len, mm_processor_kwargs=kwargs,
                             limit_mm_per_prompt={"image": 2, "video": 0})
        tokens.append(most_image_tokens(MULTIMODAL_REGISTRY.create_processor(config)))
    return tokens


def gemma4_images(model: str, max_len: int, budgets: list[int], sizes: list) -> dict:
    config = ModelConfig(model=model, max_model_len=max_len, limit_mm_per_prompt={"image": 1, "video": 0, "audio": 0})
    processor = MULTIMODAL_REGISTRY.create_processor(config)
    out = {"most_tokens": most_image_tokens(processor), "patches": {}, "tokens": {}}
    hf = processor.info.get_hf_processor()
    for budget in budgets:
        for h, w in sizes:
            inputs = hf(text=[hf.image_token], images=[[Image.new("RGB", (w, h))]], max_soft_tokens=budget,
                        return_tensors="np")
            out["patches"].setdefault(str(budget), []).append(list(inputs["pixel_values"].shape))
            out["tokens"].setdefault(str(budget), []).append(int((inputs["input_ids"] == hf.image_token_id).sum()))
    return out


def llama_guard_4_images(model: str, max_len: int, sizes: list) -> dict:
    config = ModelConfig(model=model, max_model_len=max_len, limit_mm_per_prompt={"image": 1})
    processor = MULTIMODAL_REGISTRY.create_processor(config)
    out = {"most_tokens": most_image_tokens(processor), "images": []}
    for h, w in sizes:
        inputs = processor("<|image|>", processor.info.parse_mm_data({"image": Image.new("RGB", (w, h))}))
        [item] = inputs["mm_kwargs"]["image"]
        [placeholder] = inputs["mm_placeholders"]["image"]
        out["images"].append([int(item["patches_per_image"].data), int(placeholder.get_num_embeds()),
                              placeholder.length])
    return out


def main() -> None:
    request = json.loads(sys.stdin.read())
    print(json.dumps({"qwen": qwen_largest_images(*request["qwen"]), "gemma4": gemma4_images(*request["gemma4"]),
                      "llama_guard_4": llama_guard_4_images(*request["llama_guard_4"])}))


if __name__ == "__main__":
    main()
