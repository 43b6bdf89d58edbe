"""vLLM platform-plugin entry point (group `vllm.platform_plugins`).

vLLM imports this module and calls `register()` in every process that resolves
`current_platform`, so it must stay import-light and must stay inert unless aotc
asked for the CPU twin: a plain `vllm serve` on a TPU host must never see it.
AOTC_CPU_TWIN is the flag both runners' twins share; this twin needs torch_xla, so in another stack's venv
(tpu-inference's, where the flag asks for that runner's twin) it stays inert.
"""

from __future__ import annotations

import importlib.util

from aotc.runners.twin_flag import on_the_twin

PLATFORM_QUALNAME = "aotc.runners.vllm_tpu.twin.platform.CpuTwinTpuPlatform"


def register() -> str | None:
    if not on_the_twin() or importlib.util.find_spec("torch_xla") is None:
        return None
    return PLATFORM_QUALNAME
