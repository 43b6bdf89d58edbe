"""The one variable that tells a process it runs aotc's CPU twin of its venv's stack. The runners set it for a
``device: cpu`` entry and unset it on a TPU host; no user or pod sets it. Standard library only: each runner's
vLLM plugin reads it before anything of the stack is imported."""

from __future__ import annotations

import os
from collections.abc import Mapping

TWIN_FLAG = "AOTC_CPU_TWIN"


def on_the_twin(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(TWIN_FLAG) == "1"
