"""Entry -> process environment and vLLM engine arguments for vLLM-TPU on tpu-inference (JAX).

`device: tpu` is vLLM-TPU's own start-up with VLLM_XLA_CACHE_PATH at the staging dir (tpu-inference
points JAX's persistent compilation cache there); on a host with no TPU, aotc's own processes start it on
the accelerator's compile-only devices (compile_only.py): the same graphs, compiled for that TPU, never run.
`device: cpu` is the same on JAX's CPU backend with the twin plugin (plugin.py), which vLLM only
activates when AOTC_JAX_CPU_TWIN=1.
Either way JAX's persistence thresholds are lowered so that *every* compiled graph is written: by
default JAX keeps only graphs that took >= 1 s to compile, and a pod would compile the rest again.
"""

from __future__ import annotations

import os
import time
from typing import Any

from aotc.entry import Entry
from aotc.runners.engine_common import apply_env, llm_args
from aotc.runners.engine_common import engine_args as common_engine_args
from aotc.runners.multimodal import entry_is_multimodal, text_vocab_size

from .plugin import ENV_FLAG as TWIN_FLAG

# Read by jax.config at import (JAX_<OPTION>), so they hold in every process vLLM starts.
PERSIST_EVERYTHING = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
}


def serving_env(entry: Entry, cache_dir: str, environ=None) -> dict[str, str | None]:
    """What a pod (the stock `vllm serve`) needs besides the matrix's env: None = unset. ``environ`` is
    the environment the server starts from (default: this process's)."""
    env: dict[str, str | None] = {
        "VLLM_XLA_CACHE_PATH": cache_dir,
        # From process start, not only once tpu-inference's compilation manager starts: the first few
        # graphs (jit(stage), _threefry_seed, ...) compile before it and would miss the cache.
        "JAX_COMPILATION_CACHE_DIR": cache_dir,
        "VLLM_DISABLE_COMPILE_CACHE": None,
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        **PERSIST_EVERYTHING,
    }
    if entry.model_path:
        env["HF_HUB_OFFLINE"] = "1"
    env.update(lora_env(entry))
    env.update(data_parallel_env(entry))
    if entry.device == "cpu":
        env.update(twin_device_flags(entry, environ))
        env.update({TWIN_FLAG: "1", **host_without_tpu_env(entry, "aotc-cpu-twin")})
    elif entry.device == "tpu":
        env[TWIN_FLAG] = None  # never on a real TPU host
        env["JAX_PLATFORMS"] = None
    else:
        raise ValueError(f"unknown device {entry.device!r}")
    return env


def host_without_tpu_env(entry: Entry, name: str) -> dict[str, str]:
    """The stack on JAX's CPU client, on a host with no TPU: what tpu_info and libtpu would otherwise ask the GCE
    metadata server (they name the TPU; no graph reads them), and no libtpu lock file (topology.py says why)."""
    return {"JAX_PLATFORMS": "cpu", "TPU_ACCELERATOR_TYPE": entry.accelerator, "TPU_NAME": name,
            "TPU_WORKER_ID": "0", "TPU_SKIP_MDS_QUERY": "1", "VLLM_HOST_IP": "127.0.0.1",
            "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def compile_only_target(entry: Entry):
    """The entry's TPU topology when this process builds for it without one (a ``device: tpu`` entry on a host
    with no TPU), else None. ValueError: a topology aotc cannot compile for from here."""
    from aotc.runners.tpu_host import compiles_without_running

    from .topology import topology_for

    if not compiles_without_running(entry.device):
        return None
    topology = topology_for(entry.accelerator)
    if topology.hosts > 1:
        raise ValueError(f"accelerator {entry.accelerator}: a {topology.hosts}-host slice ({topology.name}); a "
                         "host without a TPU compiles for single-host slices only")
    return topology


def lora_env(entry: Entry) -> dict[str, str]:
    """The model implementation LoRA needs (buckets.implied_env), for the build and the stock server."""
    from .plan.buckets import implied_env

    return implied_env(entry)


def data_parallel_env(entry: Entry) -> dict[str, str]:
    """`vllm serve --data-parallel-size N` would start one engine process per rank, each with a one-rank mesh
    (tpu-inference's multi-process DP, on by default for the server only); the plan, the build and the pod run
    tpu-inference's single-process SPMD data parallelism, whose graphs span all ranks."""
    from .plan.buckets import data_parallel_size

    return {"TPU_MULTIPROCESS_DP": "0"} if data_parallel_size(entry) > 1 else {}


def runtime_env(entry: Entry, cache_dir: str, environ=None) -> dict[str, str | None]:
    """Variables to set (None = unset) before vLLM is imported, for aotc's in-process build and verify:
    the pod's settings. The flags tpu-inference prepends at import need nothing here: the twin plugin
    collapses them to one copy in this process as in each of a server's (plugin.py)."""
    environ = os.environ if environ is None else environ
    env = serving_env(entry, cache_dir, environ)
    if compile_only_target(entry):
        env.update(host_without_tpu_env(entry, "aotc-compile-only"))
    env.update({
        # In-process engine: one process to measure, and the runner's jits are reachable from here.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # tpu-inference's own parallel precompile, as the build asks (its default: 1, sequential); each
        # compile stays tied to the call that submitted it (instrument._pin_pool).
        "NUM_PRECOMPILE_WORKERS": environ.get("NUM_PRECOMPILE_WORKERS") or "1",
    })
    return env


def twin_device_flags(entry: Entry, environ=None) -> dict[str, str]:
    """XLA_FLAGS with the twin's virtual devices for a tp > 1 entry (buckets.implied_flags), kept first so
    the launch's own flags still follow; read when JAX's CPU client starts, after this is set."""
    from .plan.buckets import implied_flags

    current = (os.environ if environ is None else environ).get("XLA_FLAGS", "").split()
    added = [f for f in implied_flags(entry).get("XLA_FLAGS", ()) if f not in current]
    return {"XLA_FLAGS": " ".join(added + current)} if added else {}


# The engine's seed is baked into graphs (dummy-weight init): build, verify and a pod must share it.
# vLLM's default. The traffic seed is separate.
ENGINE_SEED = 0


def engine_args(entry: Entry) -> dict[str, Any]:
    # A local model as the matrix resolved it (relative paths are relative to the config, not our cwd).
    local = entry.model_path
    # The KV cache's page count (a shape in every backbone graph) comes pinned in the entry's engine
    # arguments (aotc/fingerprint.py: pin_kv), so build, verify and pods agree; kv_size.py alone starts without it.
    return common_engine_args(entry, local or entry.model, bool(local), ENGINE_SEED)


def serve_settings(entry: Entry, cache_dir: str) -> tuple[dict[str, Any], dict[str, str | None]]:
    """RunnerSpec.serve: the stock `vllm serve`'s engine arguments and environment for this entry."""
    return engine_args(entry), serving_env(entry, cache_dir)


def cache_log() -> dict[str, Any]:
    """RunnerSpec.cache_log: JAX logs every persistent-cache lookup (jax/_src/compiler.py)."""
    # WARNING-level hit and miss lines (JAX_DEBUG_LOG_MODULES prints nothing under vLLM); neither changes a key.
    return {"env": {"JAX_LOG_COMPILES": "1", "JAX_EXPLAIN_CACHE_MISSES": "1"},
            "hit": r"Persistent compilation cache hit for '([^']+)' with key '([^']+)'",
            "miss": r"PERSISTENT COMPILATION CACHE MISS for '([^']+)' with key '([^']+)'"}


def start_engine(entry: Entry, cache_dir: str, before_start=None):
    """Start vLLM in-process; returns (llm, seconds). `before_start` runs after the env is set."""
    apply_env(runtime_env(entry, cache_dir))
    if topology := compile_only_target(entry):
        from . import compile_only
        from .topology import compile_only_devices

        compile_only.install(compile_only_devices(topology))
    if before_start is not None:
        before_start()
    started = time.perf_counter()
    from vllm import LLM

    # Prompts are token ids here; the tokenizer changes no graph. A multimodal model's input processor needs it
    # (it expands each image placeholder to the image's tokens): vLLM refuses skip_tokenizer_init there.
    llm = LLM(**llm_args(engine_args(entry)), skip_tokenizer_init=not entry_is_multimodal(entry), disable_log_stats=True)
    return llm, time.perf_counter() - started


vocab_size = text_vocab_size  # the runner's traffic API
