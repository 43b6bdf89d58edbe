"""Environment variables a runner's stack reads, and the few the fingerprint deliberately leaves out.

A runner's process inherits the builder's environment and a pod's server the pod's, so every variable the
stack reads can change what it compiles. Which ones it reads is the stack's word: its env registries
(``vllm/envs.py``, ``tpu_inference/envs.py``: ``environment_variables``), copied into each runner's
``stack_env`` module as ``READ`` and held to them by tests (tests/test_stack_env.py). The fingerprint hashes
every one (``RunnerSpec.env_vars``) but those in ``UNHASHED``, each with why it changes no graph and no key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Literal

from pydantic import Field, StrictInt

# vLLM's own compile-cache key leaves these out (vllm/envs.py ``compile_factors``: its ``ignored_factors``):
# logging, ports and hosts, timeouts, media fetching, process layout, credentials. The test derives this
# group from the stack's function, not from this list.
VLLM_IGNORES = "vLLM's own compile-cache key leaves it out (vllm/envs.py compile_factors): no graph reads it"
RUNTIME_LORA = ("opens /v1/load_lora_adapter on the API server (aotc/canary.py sets it for the stock server); "
                "adapters load into the same slots, no graph")
CACHE_LOCATION = "where the compilation cache lies (build: its staging dir; a pod: the fetched one), not what is in it"
FROM_DEVICE = "set by the runner from the entry's device (engine.py serving_env), which the fingerprint hashes"
FROM_ACCELERATOR = "set from the entry's accelerator (hashed) on the twin, by GKE on a TPU host"
HOST_IDENTITY = "the TPU host's name and worker index: which machine, not what it compiles"
FROM_DATA_PARALLEL = ("set by the runner from data_parallel_size (engine.py data_parallel_env), an engine "
                      "argument the fingerprint hashes")
PRECOMPILE_WORKERS = "how many graphs tpu-inference compiles at once, not which (build --precompile-workers)"
RUNNER_UNSETS = "unset by the runner for the build and the stock server (engine.py serving_env): never in effect"
STACK_SETS = ("set by tpu-inference itself at import (tpu_inference/env_override.py), one value in every process "
              "whatever the launch said")
PROFILING = "profiling, tracing and statistics output only"


Switch = Literal[0, 1]
# What a matrix's ``env:`` may set (RunnerSpec.env_settable) of the variables vLLM's TPU runners read, each with
# the type of its value: those the runners' plans follow (the padding gap) or that change no plan (the rest).
VLLM_TPU_SETTABLE = {
    "VLLM_TPU_BUCKET_PADDING_GAP": Annotated[StrictInt, Field(ge=0)],
    "VLLM_XLA_USE_SPMD": Switch,
    "VLLM_TPU_USING_PATHWAYS": Switch,
}


def hashed(read: Iterable[str], unhashed: Mapping[str, str]) -> tuple[str, ...]:
    """The variables of ``read`` the fingerprint hashes: all but ``unhashed``."""
    return tuple(var for var in read if var not in unhashed)
