"""Runner `vllm-tpu`: vLLM 0.13's own TPUWorker / TPUModelRunner fills the XLA cache.

Entry point: `python -m aotc.runners.vllm_tpu {build|verify} REQUEST.json RESULT.json`
(one process per entry). Modules, heaviest last:

* plan/         -- vLLM's paddings and capture_model loops as a plan, and its entry rules (no torch)
* doctor        -- `aotc doctor`'s torch_xla loadability probe
* records       -- worker records -> families/shapes (no torch)
* engine        -- entry -> environment + vllm.LLM arguments
* build, verify -- the two runner commands
* traffic       -- seeded request sweep through the real engine
* probe         -- cache-dir / counter / stderr evidence per call
* worker        -- measuring TPUWorker and its PJRT-CPU twin
* twin/         -- the CPU twin: its vLLM platform-plugin hook (twin.plugin, inert unless AOTC_CPU_TWIN=1), its
  TpuPlatform and its Pallas stand-ins (attention; the MoE grouped matmul)
* watcher       -- the serving guard's torch_xla compile counter (aotc/guard.py)

Importing this package must not import torch: vLLM loads `twin.plugin` in
every process that resolves its platform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aotc.runners.kv_sizing import SizedByStack
from aotc.runners.spec import Planner, RunnerSpec
from aotc.runners.vllm_tpu import stack_env

if TYPE_CHECKING:
    from aotc.entry import Entry


@dataclass(frozen=True)
class VllmTpuRunner(SizedByStack, RunnerSpec):
    kv_sizer = "aotc.runners.vllm_tpu.kv_sizer"

    @property
    def planner(self) -> Planner:
        # imported on first use: vLLM imports this package in every process
        from aotc.runners.vllm_tpu.plan.buckets import PLANNER

        return PLANNER

    def validate(self, entry: Entry, hf_config: dict | None) -> list[str]:
        from aotc.runners.vllm_tpu.plan.rules import validate

        return validate(entry, hf_config)

    def serve(self, entry: Entry, cache_dir: str) -> tuple[dict[str, Any], dict[str, str | None]]:
        from aotc.runners.vllm_tpu.engine import serve_settings

        return serve_settings(entry, cache_dir)

    def loadability_probe(self) -> dict[str, Any]:
        from aotc.runners.vllm_tpu.doctor import loadability_probe

        return loadability_probe()

    def watcher(self, guard: Any) -> Any:
        from aotc.runners.vllm_tpu.watcher import Watcher

        return Watcher(guard)


SPEC = VllmTpuRunner(
    name="vllm-tpu",
    module="aotc.runners.vllm_tpu",
    # jax/jaxlib: torch_xla's `pallas` extra, the version its Pallas kernels are lowered with on a TPU
    packages=("torch", "torch_xla", "vllm", "libtpu", "jax", "jaxlib"),
    env_vars=stack_env.HASHED,
    env_unhashed=stack_env.UNHASHED,
    env_settable=stack_env.SETTABLE,
    env_registries=("vllm.envs",),
    # Not the twin: vLLM 0.13's own TPUModelRunner (sample_tokens' concat_lists) extends Python lists with the
    # numpy rows LogprobsLists holds since vllm-project/vllm#28245; on a TPU too.
    unserved={"logprobs": "vLLM 0.13 TPUModelRunner: the engine core's output thread dies on 'numpy.int64 is not "
                          "serializable' and the request hangs (LogprobsLists is numpy since vllm-project/vllm#28245; "
                          "same failure: tenstorrent/tt-xla#3310)"},
    pins={"torch": "2.9.0", "torch_xla": "2.9.0", "vllm": "0.13.0", "libtpu": "0.0.21", "jax": "0.7.1",
          "jaxlib": "0.7.1"},  # requirements/full.lock
    twin_package="aotc.runners.vllm_tpu.twin",
)
