"""What both runners' ``kv_size`` modules share: stopping vLLM's engine start once the stack has sized its KV
cache, and the module's stdin/stdout protocol (aotc/kv.py runs it as ``python -m <RunnerSpec.kv_size>``).

vLLM's ``EngineCore._initialize_kv_caches`` runs the worker's ``determine_available_memory`` and
``get_kv_cache_configs``, then turns the workers' configs into the scheduler's page count
(``generate_scheduler_kv_cache_config``): that count is the answer, taken before the cache is allocated and
before any warm-up graph compiles. Imports vLLM only inside functions: runner-side.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

# The engine argument that pins the page count (vLLM's CacheConfig.num_gpu_blocks_override); aotc/kv.py reads it here.
OVERRIDE = "num_gpu_blocks_override"


class Sized(Exception):
    """Raised out of the engine's start once the stack has sized its KV cache."""

    def __init__(self, num_blocks: int):
        super().__init__(num_blocks)
        self.num_blocks = num_blocks


def stop_when_sized() -> None:
    """Wrap the engine core's own step that turns the workers' KV configs into the scheduler's page count."""
    from vllm.v1.engine import core

    sized = core.generate_scheduler_kv_cache_config

    def generate_and_stop(kv_cache_configs):
        raise Sized(int(sized(kv_cache_configs).num_blocks))

    core.generate_scheduler_kv_cache_config = generate_and_stop


def sized_by(start: Callable[[Callable[[], None]], Any], entry: dict[str, Any]) -> int:
    """The page count the stack sizes while ``start(before_start)`` starts its engine in this process
    (``before_start`` runs once the runner has set the entry's environment, before vLLM is imported)."""
    if (entry.get("engine") or {}).get(OVERRIDE):
        raise ValueError(f"the entry pins {OVERRIDE}: nothing to size")
    try:
        start(stop_when_sized)
    except Sized as sized:
        return sized.num_blocks
    raise RuntimeError("the engine started without sizing its KV cache")


def main(size_kv: Callable[[dict[str, Any]], int]) -> int:
    """The entry (``Entry.to_dict()``) as JSON on stdin; one JSON line out, ``{"kv_blocks": N}``, or
    ``{"error": "..."}`` with exit status 1 (the traceback goes to stderr)."""
    entry = json.load(sys.stdin)
    try:
        blocks = size_kv(entry)
    except Exception as exc:  # one line for the core; the log has the traceback
        import traceback

        traceback.print_exc(file=sys.stderr)
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps({"kv_blocks": blocks}))
    return 0
