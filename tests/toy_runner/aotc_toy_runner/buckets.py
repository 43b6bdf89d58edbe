"""The toy's plan side (its ``Planner``): one ``square`` graph per token bucket (doubling from 16), one ``pick``
per request count (8, 16, ... up to max_num_seqs). Import-light, as a planner must be: only aotc's data types."""

from __future__ import annotations

import hashlib
import json

from aotc.entry import Entry
from aotc.graphs import GraphSpec
from aotc.runners.spec import Planner


def token_buckets(entry: Entry) -> list[int]:
    buckets = [16]
    while buckets[-1] < entry.max_num_batched_tokens:
        buckets.append(buckets[-1] * 2)
    return buckets


def request_buckets(entry: Entry) -> list[int]:
    buckets = [8]
    while buckets[-1] < entry.max_num_seqs:
        buckets.append(buckets[-1] * 2)
    return buckets


# Tokens per KV block of the toy's "stack", which does not size its KV cache: an entry that pins no block count
# gets the core's full-length rule in these blocks. Not a divisor of the lengths tested, so the rule's rounding up
# shows.
KV_BLOCK_SIZE = 48


class ToyPlanner(Planner):
    """The two required methods and the KV block size; every other optional one keeps ``Planner``'s default (no
    mesh, no images)."""

    def capture_plan(self, entry: Entry, hf_config: dict | None) -> list[GraphSpec]:
        return ([GraphSpec.of("square", num_tokens=t) for t in token_buckets(entry)]
                + [GraphSpec.of("pick", num_reqs=r) for r in request_buckets(entry)])

    def bucket_summary(self, entry: Entry, hf_config: dict | None) -> dict:
        return {"token_paddings": token_buckets(entry), "request_paddings": request_buckets(entry)}

    def kv_block_size(self, entry: Entry) -> int:
        return KV_BLOCK_SIZE


PLANNER = ToyPlanner()


def validate(entry: Entry, hf_config: dict | None = None) -> list[str]:
    return [] if entry.max_model_len <= 4096 else ["matrix.max_model_len: the toy stops at 4096"]


def cache_file(family: str, shape: dict) -> str:
    """The file a graph "compiles" to: its digest, like a compiler's cache key."""
    return hashlib.sha256(json.dumps([family, shape], sort_keys=True).encode()).hexdigest()[:32] + ".bin"
