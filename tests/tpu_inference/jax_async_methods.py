"""Runs under the JAX venv (tests/tpu_inference/conftest.py: run_jax): vLLM's speculative methods, and those VllmConfig keeps
async scheduling on for when it is unset (vllm/config/vllm.py: EagleModelTypes, NgramGPUTypes, draft_model,
dspark, dflash).

stdout (last line): {"methods": [...], "async_methods": [...]}
"""

import json
from typing import get_args

from vllm.config.speculative import EagleModelTypes, NgramGPUTypes, SpeculativeMethod


def flat(literal) -> list[str]:
    return [leaf for arg in get_args(literal) for leaf in (flat(arg) if get_args(arg) else [arg])]


async_methods = flat(EagleModelTypes) + flat(NgramGPUTypes) + ["draft_model", "dspark", "dflash"]
print(json.dumps({"methods": sorted(set(flat(SpeculativeMethod))), "async_methods": sorted(set(async_methods))}))
