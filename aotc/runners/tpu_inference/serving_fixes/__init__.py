"""Where tpu-inference 0.32 compiles per request, the same work done where it cannot compile.

A server compiles mid-serving whenever a request's bookkeeping runs as eager JAX ops on device arrays: each
op is an XLA program keyed by its shapes, and those shapes follow the prompt or the batch, so no warm-up or
artifact can hold them all. These fixes keep every jitted graph of the stack as it is and move such
bookkeeping to the host or into jitted functions whose shapes are few and planned. The tpu-inference plugin
(plugin.register) installs them in every process where aotc sits next to tpu-inference: the build,
verify and the serving pod alike, so the artifact holds what the pod compiles. Each is held equal to the code
it replaces by tests/tpu_inference/test_serving_fixes_jax.py.

One module per model (qwen2_5_vl, gemma4, llama_guard_4, llava, qwen3_vl), one for what every multimodal
model's step shares (step_embeddings: the embeddings copied into one buffer), one for the vision warm-up's
dtype (warmup_dtype), and what they share (common). This module is the registry: `PATCHES` names the stack
module each fix patches, `install()` patches each when it is imported. Every module of this package is the
fingerprint's `serving_fixes` input of the entries whose graphs they change (buckets.SERVING_FIXES): a fix
added here is hashed without being listed. Import-light: the plugin imports it in every process.
"""

from __future__ import annotations

import functools
import importlib

# The stack module each fix patches -> the fix's module here, whose `fix(module)` patches it once it is imported.
PATCHES = {
    "tpu_inference.models.jax.qwen2_5_vl": "qwen2_5_vl",
    "tpu_inference.models.jax.gemma4_mm": "gemma4",
    "tpu_inference.models.jax.llama_guard_4": "llama_guard_4",
    "tpu_inference.runner.multimodal_manager": "step_embeddings",
    "tpu_inference.models.vllm.vllm_model_wrapper": "llava",
    "tpu_inference.runner.mm_encoder_jit_manager": "qwen3_vl",
}


def install() -> None:
    from aotc.runners.watching import when_imported

    for stack_module, fix_module in PATCHES.items():
        when_imported(stack_module, functools.partial(_apply, fix_module))


def _apply(fix_module: str, stack_module) -> None:
    importlib.import_module(f"{__name__}.{fix_module}").fix(stack_module)
