"""vLLM general-plugin entry point (group `vllm.general_plugins`) for the tpu-inference CPU twin.

vLLM calls `register()` in every process it starts (engine core, workers), before the model runner is
imported, so the twin's patches reach all of them. It stays inert — standard library only — unless aotc
asked for the twin: a real `vllm serve` on a TPU host must never see it.
"""

from __future__ import annotations

import os

ENV_FLAG = "AOTC_JAX_CPU_TWIN"


def register() -> None:
    if os.environ.get(ENV_FLAG) != "1":
        return
    from .twin import install

    install()
