"""Entry -> process environment and vLLM engine arguments for vLLM-TPU on tpu-inference (JAX).

`device: tpu` is vLLM-TPU's own start-up with VLLM_XLA_CACHE_PATH at the staging dir (tpu-inference
points JAX's persistent compilation cache there). `device: cpu` is the same on JAX's CPU backend with
the twin plugin (twin_plugin.py), which vLLM only activates when AOTC_JAX_CPU_TWIN=1.
Either way JAX's persistence thresholds are lowered so that *every* compiled graph is written: by
default JAX keeps only graphs that took >= 1 s to compile, and a pod would compile the rest again.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .twin_plugin import ENV_FLAG as TWIN_FLAG

# Read by jax.config at import (JAX_<OPTION>), so they hold in every process vLLM starts.
PERSIST_EVERYTHING = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
}


def runtime_env(entry: dict[str, Any], cache_dir: str) -> dict[str, str | None]:
    """Variables to set (None = unset) before vLLM is imported."""
    env: dict[str, str | None] = {
        # In-process engine: one process to measure, and the runner's jits are reachable from here.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_XLA_CACHE_PATH": cache_dir,
        "JAX_COMPILATION_CACHE_DIR": cache_dir,
        "VLLM_DISABLE_COMPILE_CACHE": None,
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # tpu-inference's own parallel precompile, as the launch asks (its default: 1, sequential); each
        # compile stays tied to the call that submitted it (instrument._pin_pool).
        "NUM_PRECOMPILE_WORKERS": os.environ.get("NUM_PRECOMPILE_WORKERS") or "1",
        **PERSIST_EVERYTHING,
    }
    if entry.get("model_path"):
        env["HF_HUB_OFFLINE"] = "1"
    if entry["device"] == "cpu":
        env.update(twin_device_flags(entry))
        env.update({
            TWIN_FLAG: "1",
            "JAX_PLATFORMS": "cpu",
            # tpu_info asks the GCE metadata server for these unless they are set.
            "TPU_ACCELERATOR_TYPE": entry["accelerator"],
            "TPU_NAME": "aotc-cpu-twin",
            "TPU_WORKER_ID": "0",
            "VLLM_HOST_IP": "127.0.0.1",
        })
    elif entry["device"] == "tpu":
        env[TWIN_FLAG] = None  # never on a real TPU host
        env["JAX_PLATFORMS"] = None
    else:
        raise ValueError(f"unknown device {entry['device']!r}")
    return env


def twin_device_flags(entry: dict[str, Any]) -> dict[str, str]:
    """XLA_FLAGS with the twin's virtual devices for a tp > 1 entry (buckets.implied_flags), kept first so
    the launch's own flags still follow; read when JAX's CPU client starts, after this is set."""
    from aotc.matrix import Entry

    from .buckets import implied_flags

    current = os.environ.get("XLA_FLAGS", "").split()
    added = [f for f in implied_flags(Entry.from_dict(entry)).get("XLA_FLAGS", ()) if f not in current]
    return {"XLA_FLAGS": " ".join(added + current)} if added else {}


def apply_env(env: dict[str, str | None]) -> None:
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# The engine's seed is baked into graphs (dummy-weight init): build, verify and a pod must share it.
# vLLM's default. The traffic seed is separate.
ENGINE_SEED = 0


def engine_args(entry: dict[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = {
        # A local model as the matrix resolved it (relative paths are relative to the config, not our cwd).
        "model": entry.get("model_path") or entry["model"],
        "max_model_len": entry["max_model_len"],
        "max_num_seqs": entry["max_num_seqs"],
        "max_num_batched_tokens": entry["max_num_batched_tokens"],
        "tensor_parallel_size": entry["tensor_parallel_size"],
        "dtype": entry["dtype"],
        # Graphs depend on shapes and dtypes, never on weight values.
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "seed": ENGINE_SEED,
        "disable_log_stats": True,
    }
    if entry["device"] == "cpu":
        # The KV cache's page count is a shape in every backbone graph: fix it, for build and verify
        # alike, at what max_num_seqs full-length requests need (+1: vLLM's null block).
        args["num_gpu_blocks_override"] = kv_blocks(entry)
    if not entry.get("model_path") and entry.get("revision"):
        args["revision"] = entry["revision"]
    args.update(entry.get("engine") or {})
    return args


def kv_blocks(entry: dict[str, Any]) -> int:
    from .buckets import page_size_for

    block = (entry.get("engine") or {}).get("block_size") or page_size_for(entry["max_model_len"])
    return entry["max_num_seqs"] * -(-entry["max_model_len"] // block) + 1


def start_engine(entry: dict[str, Any], cache_dir: str, before_start=None):
    """Start vLLM in-process; returns (llm, seconds). `before_start` runs after the env is set."""
    apply_env(runtime_env(entry, cache_dir))
    if before_start is not None:
        before_start()
    started = time.perf_counter()
    from vllm import LLM

    llm = LLM(**engine_args(entry))
    return llm, time.perf_counter() - started


def vocab_size(llm) -> int:
    return llm.llm_engine.model_config.get_vocab_size()
