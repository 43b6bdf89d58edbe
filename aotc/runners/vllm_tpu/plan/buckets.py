"""vLLM 0.13 TPUModelRunner's padding rules and capture_model loops, as plain data.

Re-implemented (not imported) so that ``aotc plan`` runs without torch or vLLM; tests prove these
equal vLLM's own ``_get_token_paddings``, ``_get_req_paddings`` and
``_get_padded_num_reqs_with_upper_limit`` over a randomized sweep.
"""

from __future__ import annotations

from aotc.entry import Entry
from aotc.graphs import GraphSpec
# MIN_NUM_SEQS = tpu_model_runner.MIN_NUM_SEQS; the rules equal its _get_*_paddings (tests/vllm_tpu/test_plan.py)
from aotc.runners import llava
from aotc.runners.llava import image_tokens
from aotc.runners.multimodal import is_multimodal
from aotc.runners.paddings import (MIN_NUM_SEQS, cdiv, next_power_of_2, padded_num_reqs_with_upper_limit,  # noqa: F401
                                   page_size, req_paddings, token_paddings)
from aotc.runners.spec import Planner

MIN_TOKEN_PADDING = 16  # TPUModelRunner: _get_token_paddings(min_token_size=16, ...)


def max_num_seqs_for_len(model_len: int, block_size: int) -> int:
    """PallasAttentionBackend.get_max_num_seqs: keeps the block table within the kernel's SMEM."""
    return 1024 * 1024 // 2 // cdiv(model_len, block_size) // 4


def capture_plan(entry: Entry, hf_config: dict | None = None) -> list[GraphSpec]:
    """Every graph ``TPUModelRunner.capture_model`` compiles, in its order."""
    gap = int(entry.env.get("VLLM_TPU_BUCKET_PADDING_GAP", 0))
    most_model_len = entry.env.get("VLLM_TPU_MOST_MODEL_LEN")
    block_size = page_size(entry.max_model_len)
    max_num_reqs = max(entry.max_num_seqs, MIN_NUM_SEQS)
    tokens = token_paddings(MIN_TOKEN_PADDING, entry.max_num_batched_tokens, gap)
    reqs = req_paddings(MIN_NUM_SEQS, max_num_reqs)

    graphs: list[GraphSpec] = []
    if is_multimodal(hf_config):
        graphs += multimodal_graphs(entry, hf_config, tokens)
    backbone_variants = [(min(max_num_seqs_for_len(entry.max_model_len, block_size), max_num_reqs),
                          cdiv(entry.max_model_len, block_size))]
    if most_model_len is not None:
        backbone_variants.append((min(max_num_seqs_for_len(most_model_len, block_size), max_num_reqs),
                                  cdiv(most_model_len, block_size)))
    backbone_variants = list(dict.fromkeys(backbone_variants))  # equal lengths: the runner's second run is a hit
    for t in tokens:
        graphs += [GraphSpec.of("backbone", num_tokens=t, num_reqs=r, num_blocks=b) for r, b in backbone_variants]
    for t in tokens:
        for r in reqs:
            graphs.append(GraphSpec.of("select_hidden_states", num_tokens=t, num_reqs=r))
            if r >= min(t, max_num_reqs):  # the runner's early break
                break
    graphs += [GraphSpec.of("compute_logits", num_reqs=r) for r in reqs]
    graphs += [GraphSpec.of("structured_decoding", num_reqs=r) for r in reqs]
    graphs += [GraphSpec.of("sample_from_logits", num_reqs=r, all_greedy=g) for r in reqs for g in (False, True)]
    graphs += [GraphSpec.of("gather_logprobs", num_reqs=r) for r in reqs]
    return graphs


# vLLM 0.13 multimodal models the plan covers: an image's token count is fixed by the config (the image processor
# resizes every image to the tower's size), so the encoder's graphs are known before any image arrives.
PLANNED_MULTIMODAL_ARCHITECTURES = frozenset({llava.ARCHITECTURE})


def max_images_per_batch(entry: Entry, hf_config: dict) -> int:
    """MultiModalBudget.get_max_items (vllm/v1/worker/utils.py) for images: how many one step's encoder may
    take, bounded by the encoder budget (max_num_batched_tokens, TpuPlatform forcing whole images) and by the
    requests' images (limit_mm_per_prompt, vLLM's default 999)."""
    per_image = image_tokens(hf_config)
    budget = max(entry.max_num_batched_tokens, per_image)
    limit = (entry.engine.get("limit_mm_per_prompt") or {}).get("image", 999)
    per_prompt = max(1, min(limit, entry.max_model_len // per_image))
    max_num_reqs = entry.max_num_seqs
    if entry.engine.get("enable_chunked_prefill") is False:
        max_num_reqs = min(max_num_reqs, entry.max_num_batched_tokens // per_image)
    return max(1, min(budget // per_image, max_num_reqs * per_prompt))


def multimodal_graphs(entry: Entry, hf_config: dict, tokens: list[int]) -> list[GraphSpec]:
    """TPUModelRunner._precompile_mm_encoder: per image count up to a step's most, the encoder over that many
    images, then the input embedding with their embeddings merged in at every token bucket that holds them;
    last the input embedding of text alone (num_items 0) per token bucket."""
    per_image = image_tokens(hf_config)
    graphs = []
    for items in range(1, max_images_per_batch(entry, hf_config) + 1):
        graphs.append(GraphSpec.of("mm_encoder", num_items=items))
        graphs += [GraphSpec.of("embed_inputs", num_tokens=t, num_items=items)
                   for t in tokens if t >= items * per_image]
    return graphs + [GraphSpec.of("embed_inputs", num_tokens=t, num_items=0) for t in tokens]


def traffic_images(entry: Entry, hf_config: dict | None) -> tuple[tuple[int, int, int], ...]:
    """(height, width, prompt tokens) of the images a sweep and the canary send; () for a text model."""
    return llava.traffic_images(hf_config) if is_multimodal(hf_config) else ()


def bucket_summary(entry: Entry, hf_config: dict | None) -> dict:
    gap = int(entry.env.get("VLLM_TPU_BUCKET_PADDING_GAP", 0))
    return {
        "token_paddings": token_paddings(MIN_TOKEN_PADDING, entry.max_num_batched_tokens, gap),
        "request_paddings": req_paddings(MIN_NUM_SEQS, max(entry.max_num_seqs, MIN_NUM_SEQS)),
        "block_size": page_size(entry.max_model_len),
    }



class VllmTpuPlanner(Planner):
    """vllm-tpu's plan side (``RunnerSpec.planner``): the rules above, no torch."""

    capture_plan = staticmethod(capture_plan)
    bucket_summary = staticmethod(bucket_summary)
    traffic_images = staticmethod(traffic_images)


PLANNER = VllmTpuPlanner()
