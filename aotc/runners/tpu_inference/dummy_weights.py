"""A dummy-weight engine loads its speculative draft with dummy weights too.

aotc's build and verify run the engine with `load_format: dummy` (graphs do not depend on weights).
tpu-inference 0.32's loader rewrites the engine's load format from "dummy" to "jax_dummy" (or
"pathways_dummy") in place when it loads a target through its iterator loader (Qwen2, Qwen3, Gemma 4); a
draft loaded after it (DFlash's DFlashForCausalLM) then sees no "dummy", takes the checkpoint path and
fails on a directory without weights. This puts "dummy" back for the draft's load only. The plugin
(twin_plugin.register) installs it wherever tpu-inference is: a server with real weights never has a dummy
format, so there it never acts.
"""

from __future__ import annotations

import contextlib
import functools

from .serving_fixes import attribute_set

MODEL_LOADER = "tpu_inference.models.common.model_loader"
# What tpu-inference's _get_nnx_model rewrites "dummy" to once a target has loaded through it.
REWRITTEN_DUMMY_FORMATS = frozenset({"jax_dummy", "pathways_dummy"})
INSTALLED = "_aotc_dummy_draft"


def install() -> None:
    from aotc.runners.watching import when_imported

    when_imported(MODEL_LOADER, _fix_model_loader)


def _fix_model_loader(module) -> None:
    if getattr(module._get_nnx_model, INSTALLED, False):
        return
    module._get_nnx_model = draft_with_dummy_weights(module._get_nnx_model)


def draft_with_dummy_weights(get_nnx_model):
    @functools.wraps(get_nnx_model)
    def get_nnx_model_dummy_draft(model_class, vllm_config, *args, is_draft_model=False, **kwargs):
        load_config = vllm_config.load_config
        dummy_draft = is_draft_model and load_config.load_format in REWRITTEN_DUMMY_FORMATS
        with attribute_set(load_config, "load_format", "dummy") if dummy_draft else contextlib.nullcontext():
            return get_nnx_model(model_class, vllm_config, *args, is_draft_model=is_draft_model, **kwargs)

    setattr(get_nnx_model_dummy_draft, INSTALLED, True)
    return get_nnx_model_dummy_draft
