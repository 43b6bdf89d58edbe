"""Seeded traffic for vLLM 0.13's TPU runner: the neutral sweep (aotc/runners/traffic.py) over this
runner's request buckets, with images for a vision model. No prompt logprobs: the torch_xla runner does not
support them."""

from __future__ import annotations

from aotc.entry import Entry, hf_config
from aotc.runners.multimodal import text_vocab_size, with_images
from aotc.runners.traffic import Limits, TrafficRequest, run_traffic  # noqa: F401  (the runner's traffic API)
from aotc.runners.traffic import plan_traffic as _plan_traffic

from .plan.buckets import MIN_NUM_SEQS, req_paddings, traffic_images


def request_buckets(max_num_seqs: int) -> list[int]:
    return req_paddings(MIN_NUM_SEQS, max(max_num_seqs, MIN_NUM_SEQS))


def plan_traffic(seed: int, requests: int, entry: Entry, llm) -> list[list[TrafficRequest]]:
    """The sweep for ``entry`` through ``llm``, its engine; a vision model's images among the prompts."""
    limits = Limits.of(entry, request_buckets(entry.max_num_seqs))
    limits = with_images(limits, entry, traffic_images(entry, hf_config(entry)), llm)
    return _plan_traffic(seed, requests, limits, text_vocab_size(llm))
