"""Seeded traffic for vLLM 0.13's TPU runner: the neutral sweep (aotc/runners/traffic.py) over this
runner's request buckets. No prompt logprobs: the torch_xla runner does not support them."""

from __future__ import annotations

from typing import Any

from aotc.runners.traffic import Limits, Request, run_traffic  # noqa: F401  (the runner's traffic API)
from aotc.runners.traffic import plan_traffic as _plan_traffic

from .buckets import MIN_NUM_SEQS, req_paddings


def request_buckets(max_num_seqs: int) -> list[int]:
    return req_paddings(MIN_NUM_SEQS, max(max_num_seqs, MIN_NUM_SEQS))


def plan_traffic(seed: int, requests: int, entry: dict[str, Any], vocab: int) -> list[list[Request]]:
    return _plan_traffic(seed, requests, Limits.of(entry, request_buckets(entry["max_num_seqs"])), vocab)
