"""What the vLLM-based runners share about starting an in-process engine for an entry: the process
environment (set before the stack is imported: it reads it at import) and the engine arguments."""

from __future__ import annotations

import copy
import os
from typing import Any

from aotc.engine_args import POD_ONLY_ARGS
from aotc.entry import Entry
from aotc.processes import update_env


def apply_env(env: dict[str, str | None]) -> None:
    """Set each variable in this process; ``None`` unsets it."""
    update_env(os.environ, env)


def engine_args(entry: Entry, model: str, local: bool, seed: int, **runner_args: Any) -> dict[str, Any]:
    """vLLM engine arguments for an entry, shared by aotc's in-process engine and the stock ``vllm serve``
    (aotc/server.py): its shapes and dtype, dummy weights, then the runner's own arguments, then the matrix's
    ``engine:`` (last, so an entry can override any of them)."""
    args: dict[str, Any] = {
        "model": model,
        "max_model_len": entry.max_model_len,
        "max_num_seqs": entry.max_num_seqs,
        "max_num_batched_tokens": entry.max_num_batched_tokens,
        "tensor_parallel_size": entry.tensor_parallel_size,
        "dtype": entry.dtype,
        # Graphs depend on shapes and dtypes, never on weight values.
        "load_format": "dummy",
        "seed": seed,
        **runner_args,
    }
    if not local and entry.revision:
        args["revision"] = entry.revision
    args.update(copy.deepcopy(entry.engine))  # the caller may edit the arguments; the entry is frozen
    return args


def llm_args(args: dict[str, Any]) -> dict[str, Any]:
    """The arguments an in-process ``LLM(...)`` takes: ``vllm serve``'s front-end settings (a pod's host,
    its served names, its logging) belong to the server alone and change no graph. Imports vLLM."""
    import dataclasses

    from vllm import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    return {key: value for key, value in args.items() if key in fields and key not in POD_ONLY_ARGS}
