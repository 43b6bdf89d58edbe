"""What the vLLM-based runners share about starting an in-process engine for an entry: the process
environment (set before the stack is imported: it reads it at import) and the engine arguments."""

from __future__ import annotations

import os
from typing import Any


def apply_env(env: dict[str, str | None]) -> None:
    """Set each variable; ``None`` unsets it."""
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def engine_args(entry: dict[str, Any], model: str, local: bool, seed: int, **runner_args: Any) -> dict[str, Any]:
    """vLLM engine arguments for an entry, shared by aotc's in-process engine and the stock ``vllm serve``
    (aotc/server.py): its shapes and dtype, dummy weights, then the runner's own arguments, then the matrix's
    ``engine:`` (last, so an entry can override any of them)."""
    args: dict[str, Any] = {
        "model": model,
        "max_model_len": entry["max_model_len"],
        "max_num_seqs": entry["max_num_seqs"],
        "max_num_batched_tokens": entry["max_num_batched_tokens"],
        "tensor_parallel_size": entry["tensor_parallel_size"],
        "dtype": entry["dtype"],
        # Graphs depend on shapes and dtypes, never on weight values.
        "load_format": "dummy",
        "seed": seed,
        **runner_args,
    }
    if not local and entry.get("revision"):
        args["revision"] = entry["revision"]
    args.update(entry.get("engine") or {})
    return args
