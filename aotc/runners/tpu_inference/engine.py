"""Entry -> process environment and vLLM engine arguments for vLLM-TPU on tpu-inference (JAX).

`device: tpu` is vLLM-TPU's own start-up with VLLM_XLA_CACHE_PATH at the staging dir (tpu-inference
points JAX's persistent compilation cache there); on a host with no TPU, aotc's own processes start it on
the accelerator's compile-only devices (compile_only.py): the same graphs, compiled for that TPU, never run.
`device: cpu` is the same on JAX's CPU backend with the twin plugin (plugin.py), which vLLM only
activates when AOTC_CPU_TWIN=1.
Either way JAX's persistence thresholds are lowered so that *every* compiled graph is written: by
default JAX keeps only graphs that took >= 1 s to compile, and a pod would compile the rest again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from aotc.accelerators import to_cloud_name
from aotc.entry import Entry
from aotc.runners.multimodal import text_vocab_size
from aotc.runners.vllm_engine import Env, VllmEngine


# Read by jax.config at import (JAX_<OPTION>), so they hold in every process vLLM starts.
PERSIST_EVERYTHING = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
}

# The engine's seed is baked into graphs (dummy-weight init): build, verify and a pod must share it.
# vLLM's default. The traffic seed is separate.
ENGINE_SEED = 0


class TpuInferenceEngine(VllmEngine):
    """vLLM-TPU on tpu-inference: JAX's persistent cache, the twin on JAX's CPU client, compile-only devices."""

    serve_seed = ENGINE_SEED

    def stack_env(self, entry: Entry, cache_dir: str) -> Env:
        return {
            # From process start, not only once tpu-inference's compilation manager starts: the first few
            # graphs (jit(stage), _threefry_seed, ...) compile before it and would miss the cache.
            "JAX_COMPILATION_CACHE_DIR": cache_dir,
            "VLLM_DISABLE_COMPILE_CACHE": None,
            **PERSIST_EVERYTHING,
            **lora_env(entry),
            **data_parallel_env(entry),
        }

    def device_env(self, entry: Entry, environ: Mapping[str, str]) -> Env:
        if entry.device == "cpu":
            return {**twin_device_flags(entry, environ), **host_without_tpu_env(entry, "aotc-cpu-twin")}
        return {"JAX_PLATFORMS": None}

    def in_process_env(self, entry: Entry, environ: Mapping[str, str]) -> Env:
        """The flags tpu-inference prepends at import need nothing here: the twin plugin collapses them to one
        copy in this process as in each of a server's (plugin.py)."""
        env = host_without_tpu_env(entry, "aotc-compile-only") if compile_only_target(entry) else {}
        # tpu-inference's own parallel precompile, as the build asks (its default: 1, sequential); each
        # compile stays tied to the call that submitted it (instrument._pin_pool).
        return {**env, "NUM_PRECOMPILE_WORKERS": environ.get("NUM_PRECOMPILE_WORKERS") or "1"}

    def prepare(self, entry: Entry) -> None:
        if topology := compile_only_target(entry):
            from . import compile_only
            from .topology import compile_only_devices

            compile_only.install(compile_only_devices(topology))


ENGINE = TpuInferenceEngine()
serving_env = ENGINE.serving_env
runtime_env = ENGINE.runtime_env
serve_settings = ENGINE.serve_settings


def engine_args(entry: Entry) -> dict[str, Any]:
    return ENGINE.engine_args(entry, ENGINE_SEED)


def start_engine(entry: Entry, cache_dir: str, before_start=None):
    """Start vLLM in-process with the seed a pod serves with (see ``ENGINE_SEED``); returns (llm, seconds)."""
    return ENGINE.start_engine(entry, cache_dir, ENGINE_SEED, before_start)


def host_without_tpu_env(entry: Entry, name: str) -> dict[str, str]:
    """The stack on JAX's CPU client, on a host with no TPU: what tpu_info and libtpu would otherwise ask the GCE
    metadata server (they name the TPU; no graph reads them), and no libtpu lock file (topology.py says why)."""
    return {"JAX_PLATFORMS": "cpu", "TPU_ACCELERATOR_TYPE": to_cloud_name(entry.accelerator), "TPU_NAME": name,
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


def twin_device_flags(entry: Entry, environ=None) -> dict[str, str]:
    """XLA_FLAGS with the twin's virtual devices for a tp > 1 entry (buckets.implied_flags), kept first so
    the launch's own flags still follow; read when JAX's CPU client starts, after this is set."""
    from .plan.buckets import implied_flags

    current = (os.environ if environ is None else environ).get("XLA_FLAGS", "").split()
    added = [f for f in implied_flags(entry).get("XLA_FLAGS", ()) if f not in current]
    return {"XLA_FLAGS": " ".join(added + current)} if added else {}


def cache_log() -> dict[str, Any]:
    """RunnerSpec.cache_log: JAX logs every persistent-cache lookup (jax/_src/compiler.py)."""
    # WARNING-level hit and miss lines (JAX_DEBUG_LOG_MODULES prints nothing under vLLM); neither changes a key.
    return {"env": {"JAX_LOG_COMPILES": "1", "JAX_EXPLAIN_CACHE_MISSES": "1"},
            "hit": r"Persistent compilation cache hit for '([^']+)' with key '([^']+)'",
            "miss": r"PERSISTENT COMPILATION CACHE MISS for '([^']+)' with key '([^']+)'"}


vocab_size = text_vocab_size  # the runner's traffic API
