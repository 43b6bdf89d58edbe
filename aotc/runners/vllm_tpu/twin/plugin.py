"""vLLM platform-plugin entry point (group `vllm.platform_plugins`).

vLLM imports this module and calls `register()` in every process that resolves
`current_platform`, so it must stay import-light and must stay inert unless aotc
asked for the CPU twin: a plain `vllm serve` on a TPU host must never see it.
"""

from __future__ import annotations

import os

ENV_FLAG = "AOTC_CPU_TWIN"
PLATFORM_QUALNAME = "aotc.runners.vllm_tpu.twin.platform.CpuTwinTpuPlatform"


def register() -> str | None:
    if os.environ.get(ENV_FLAG) != "1":
        return None
    return PLATFORM_QUALNAME
