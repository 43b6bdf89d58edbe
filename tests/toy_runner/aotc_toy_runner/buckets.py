"""The toy's plan rules: one ``square`` graph per token bucket (doubling from 16), one ``pick`` per request
count (8, 16, ... up to max_num_seqs)."""

from __future__ import annotations

import hashlib
import json

from aotc.graphs import GraphSpec


def token_buckets(entry) -> list[int]:
    buckets = [16]
    while buckets[-1] < entry.max_num_batched_tokens:
        buckets.append(buckets[-1] * 2)
    return buckets


def request_buckets(entry) -> list[int]:
    buckets = [8]
    while buckets[-1] < entry.max_num_seqs:
        buckets.append(buckets[-1] * 2)
    return buckets


def capture_plan(entry, hf_config=None) -> list[GraphSpec]:
    return ([GraphSpec.of("square", num_tokens=t) for t in token_buckets(entry)]
            + [GraphSpec.of("pick", num_reqs=r) for r in request_buckets(entry)])


def bucket_summary(entry) -> dict:
    return {"token_paddings": token_buckets(entry), "request_paddings": request_buckets(entry)}


def validate(entry, hf_config=None) -> list[str]:
    return [] if entry.max_model_len <= 4096 else ["matrix.max_model_len: the toy stops at 4096"]


def cache_file(family: str, shape: dict) -> str:
    """The file a graph "compiles" to: its digest, like a compiler's cache key."""
    return hashlib.sha256(json.dumps([family, shape], sort_keys=True).encode()).hexdigest()[:32] + ".bin"
