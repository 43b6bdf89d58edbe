"""The KV page count tpu-inference gives an entry when nothing pins it: its own memory sizing, nothing else.

Run as ``python -m aotc.runners.tpu_inference.kv_size`` under the runner's interpreter with the entry
(``Entry.to_dict()``, without ``num_gpu_blocks_override``) as JSON on stdin. It starts the in-process engine
as a build does, lets vLLM's ``EngineCore._initialize_kv_caches`` run the worker's
``determine_available_memory`` (HBM after weights × ``gpu_memory_utilization``; on the CPU twin the twin's
stated HBM, twin.py) and ``get_kv_cache_configs``, and stops the engine when the scheduler's page count is
known: before the KV cache is allocated and before any warm-up graph compiles. Prints one JSON line,
``{"kv_blocks": N}``, or ``{"error": "..."}`` with exit status 1.
"""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any

from .twin import HBM_BYTES_ENV

# What the sizing reads besides the fingerprint's inputs (aotc/kv.py keys its answers on them too).
SIZING_ENV = (HBM_BYTES_ENV,)


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


def size_kv(entry: dict[str, Any]) -> int:
    from .engine import start_engine

    if (entry.get("engine") or {}).get("num_gpu_blocks_override"):
        raise ValueError("the entry pins num_gpu_blocks_override: nothing to size")
    with tempfile.TemporaryDirectory(prefix="aotc-kv-size-") as cache_dir:
        try:
            start_engine(entry, cache_dir, before_start=stop_when_sized)
        except Sized as sized:
            return sized.num_blocks
    raise RuntimeError("the engine started without sizing its KV cache")


def main() -> int:
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


if __name__ == "__main__":
    sys.exit(main())
