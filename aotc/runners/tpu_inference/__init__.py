"""Runner `tpu-inference`: vLLM-TPU 0.32 on tpu-inference (JAX) fills JAX's persistent compilation cache.

Entry point: `python -m aotc.runners.tpu_inference {build|verify} REQUEST.json RESULT.json`, under the
JAX venv's interpreter (requirements/jax.lock; the core finds it through AOTC_PYTHON_TPU_INFERENCE).
Unlike torch_xla 2.9's, this cache loads: verify proves every compile request of a fresh server is a hit.

* plan/         -- tpu-inference's paddings, precompile loops and entry rules as a plan, per multimodal model too
  (no JAX; the core imports it)
* plugin        -- vLLM general-plugin hook, loaded in every process (a pod's too): collapses the stack's flags,
  installs the serving fixes and the dummy-weight draft, and the twin's patches only under AOTC_CPU_TWIN=1
* kv_sizer      -- the stack's own KV sizing, run in its interpreter
* beyond_warmup -- the graphs a server reaches that the stack's warm-up skips, compiled as it compiles them
* twin/         -- the CPU twin: its patches, its jittable ragged paged and MLA attention, its MoE grouped matmul,
  its GDN kernel, the JAX DeepSeek V3 at its config's sizes
* serving_fixes/ -- where the stack compiles per request, the same work done where it cannot: one module per
  model, its __init__ the registry the plugin installs
* dummy_weights -- a dummy-weight engine's draft loads with dummy weights too (the plugin installs it)
* engine        -- entry -> environment + vllm.LLM arguments (every graph persisted)
* topology, compile_only -- a TPU target on a host without one: the accelerator's libtpu topology, and its
  compile-only devices as the process's JAX devices (every graph compiles for the TPU, nothing runs)
* probe, instrument -- JAX cache evidence per precompile call and per runtime step
* watcher       -- the serving guard's JAX compile counter (aotc/guard.py)
* session, build, verify -- the two runner commands (records: aotc/runners/records.py)

Importing this package must not import JAX: vLLM loads `plugin` in every process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aotc.runners.kv_sizing import SizedByStack
from aotc.runners.spec import Planner, RunnerSpec
from aotc.runners.tpu_inference import stack_env

if TYPE_CHECKING:
    from aotc.entry import Entry


@dataclass(frozen=True)
class TpuInferenceRunner(SizedByStack, RunnerSpec):
    kv_sizer = "aotc.runners.tpu_inference.kv_sizer"

    @property
    def planner(self) -> Planner:
        # imported on first use: vLLM imports this package in every process
        from aotc.runners.tpu_inference.plan.buckets import PLANNER

        return PLANNER

    def validate(self, entry: Entry, hf_config: dict | None) -> list[str]:
        from aotc.runners.tpu_inference.plan.rules import validate

        return validate(entry, hf_config)

    def serve(self, entry: Entry, cache_dir: str) -> tuple[dict[str, Any], dict[str, str | None]]:
        from aotc.runners.tpu_inference.engine import serve_settings

        return serve_settings(entry, cache_dir)

    def tpu_targets(self, environ=None) -> list[dict[str, Any]]:
        from .topology import targets_on_this_host

        return targets_on_this_host(self.python(environ))

    def watcher(self, guard: Any) -> Any:
        from aotc.runners.tpu_inference.watcher import Watcher

        return Watcher(guard)

    def cache_log(self) -> dict[str, Any]:
        from aotc.runners.tpu_inference.engine import cache_log

        return cache_log()


SPEC = TpuInferenceRunner(
    name="tpu-inference",
    module="aotc.runners.tpu_inference",
    packages=("jax", "jaxlib", "libtpu", "tpu-inference", "vllm-tpu", "torchax"),
    env_vars=stack_env.HASHED,
    env_unhashed=stack_env.UNHASHED,
    env_settable=stack_env.SETTABLE,
    env_registries=("vllm.envs", "tpu_inference.envs"),
    # tpu_inference/env_override.py adds these at import (a test pins this table to it)
    stack_flags={"XLA_FLAGS": ("--xla_cpu_max_isa=AVX2",),
                 "LIBTPU_INIT_ARGS": ("--xla_tpu_use_dynamic_smem_negotiation=true",)},
    pins={"jax": "0.11.2", "jaxlib": "0.11.2", "libtpu": "0.0.48", "tpu-inference": "0.32.0", "vllm-tpu": "0.32.0",
          "torchax": "0.0.13"},  # requirements/jax.lock
    # tpu_inference TpuPlatform.validate_request raises a plain ValueError, which vLLM 0.32's AsyncLLM.generate
    # wraps in EngineGenerateError: the refusal reaches the client as HTTP 500 with an empty message.
    unserved={"seed": "tpu-inference refuses a per-request seed ('JAX does not support per-request seed.', "
                      "TpuPlatform.validate_request); vLLM 0.32 answers it with HTTP 500 and an empty message"},
    unserved_with_images={"prompt_logprobs": "tpu-inference 0.32 raises 'prompt_logprobs is not supported for "
                                             "multimodal models' in the engine core's step "
                                             "(TPUModelRunner._execute_model), which kills the server"},
    cache_loads=True,
    tpu_targets_on_cpu_host=True,
    twin_package="aotc.runners.tpu_inference.twin",
)
