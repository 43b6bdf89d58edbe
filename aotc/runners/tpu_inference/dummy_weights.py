"""A dummy-weight engine loads its speculative draft with dummy weights too.

aotc's build and verify run the engine with `load_format: dummy` (graphs do not depend on weights).
tpu-inference 0.32's loader rewrites the engine's load format from "dummy" to "jax_dummy" (or
"pathways_dummy") in place when it loads a target through its iterator loader (Qwen2, Qwen3, Gemma 4); a
draft loaded after it (DFlash's DFlashForCausalLM) then sees no "dummy", takes the checkpoint path and
fails on a directory without weights. This puts "dummy" back for the draft's load only. The plugin
(plugin.register) installs it wherever tpu-inference is: a server with real weights never has a dummy
format, so there it never acts.

The same loader makes that rewrite only after it has built the model, and DeepSeek V3's JAX model refuses
"dummy" in its constructor on every MoE backend the stack selects ("Random / dummy weights are not supported
... right now"). Past that refusal, the "jax_dummy" loader it would then use skips two steps of DeepSeek's
checkpoint loader: the split of kv_b_proj into k_up_proj / v_up_proj (MLAEinsum.load_weights, on its last
checkpoint tensor) and the RoPE table (model.initialize_cache()). So a model that loads through the iterator
loader gets the rewritten format before it is built (the stack's own rewrite, made earlier), and the dummy
loader hands each MLAEinsum its last tensor before processing the weights and builds the RoPE table after,
as the checkpoint loader does. Each of these stopped a dummy-weight build of the JAX DeepSeek V3 on the twin
(measured one by one) and would stop one on a TPU: none is a twin substitution.
"""

from __future__ import annotations

import contextlib
import functools

from .serving_fixes.common import attribute_set

MODEL_LOADER = "tpu_inference.models.common.model_loader"
WEIGHT_UTILS = "tpu_inference.models.jax.utils.weight_utils"
# What tpu-inference's _get_nnx_model rewrites "dummy" to once a target has loaded through it.
REWRITTEN_DUMMY_FORMATS = frozenset({"jax_dummy", "pathways_dummy"})
INSTALLED = "_aotc_dummy_draft"


def install() -> None:
    from aotc.runners.watching import when_imported

    when_imported(MODEL_LOADER, _fix_model_loader)
    when_imported(WEIGHT_UTILS, _fix_dummy_loader)


def _fix_model_loader(module) -> None:
    if getattr(module._get_nnx_model, INSTALLED, False):
        return
    module._get_nnx_model = loading_on_dummy_formats_fixed(module._get_nnx_model)


def rewritten_dummy_format() -> str:
    """What _get_nnx_model rewrites "dummy" to for a model that loads through the iterator loader."""
    import vllm.envs as vllm_envs

    return "pathways_dummy" if vllm_envs.VLLM_TPU_USING_PATHWAYS else "jax_dummy"


def loading_on_dummy_formats_fixed(get_nnx_model):
    @functools.wraps(get_nnx_model)
    def get_nnx_model_on_dummy_formats_fixed(model_class, vllm_config, *args, is_draft_model=False, **kwargs):
        from tpu_inference.models.jax.utils.weight_utils import LoadableWithIterator

        load_config = vllm_config.load_config
        iterator_loaded = issubclass(model_class, LoadableWithIterator)
        if load_config.load_format == "dummy" and iterator_loaded:
            load_config.load_format = rewritten_dummy_format()
        dummy_draft = is_draft_model and load_config.load_format in REWRITTEN_DUMMY_FORMATS and not iterator_loaded
        with attribute_set(load_config, "load_format", "dummy") if dummy_draft else contextlib.nullcontext():
            return get_nnx_model(model_class, vllm_config, *args, is_draft_model=is_draft_model, **kwargs)

    setattr(get_nnx_model_on_dummy_formats_fixed, INSTALLED, True)
    return get_nnx_model_on_dummy_formats_fixed


def _fix_dummy_loader(module) -> None:
    loader = module.JaxDummyModelLoader
    if getattr(loader._process_weights_after_loading, INSTALLED, False):
        return
    loader._process_weights_after_loading = as_the_checkpoint_loader_does(loader._process_weights_after_loading,
                                                                          module.LoadableWithIterator)


def as_the_checkpoint_loader_does(process, model_base):
    @functools.wraps(process)
    def process_as_loaded(self, module) -> None:
        if not isinstance(module, model_base):  # the loader recurses through the model's modules
            return process(self, module)
        _split_latent_projections(module)
        process(self, module)
        inner = getattr(module, "model", None)
        if hasattr(inner, "initialize_cache") and not hasattr(module, "initialize_cache"):
            inner.initialize_cache()

    setattr(process_as_loaded, INSTALLED, True)
    return process_as_loaded


def _split_latent_projections(model) -> None:
    """DeepSeek's MLAEinsum splits kv_b_proj into the k_up_proj and v_up_proj the forward pass uses when its
    last checkpoint tensor arrives; the dummy loader never hands it one. Hand it its own last tensor, as loaded,
    before the weights are processed (processing replaces them)."""
    import sys

    deepseek = sys.modules.get("tpu_inference.models.jax.deepseek_v3")
    if deepseek is None:
        return
    unsplit = [module for _, module in model.named_modules()
               if isinstance(module, deepseek.MLAEinsum) and hasattr(module, "weight")]
    for module in unsplit:  # a split adds modules to its attention layer
        params = dict(module.named_parameters())
        *earlier, last = params
        module.loaded = set(earlier)
        module.load_weights([(last, _as_torch(params[last][...]))])


def _as_torch(array):
    import jax
    import numpy as np
    import torch

    host = np.asarray(jax.device_get(array))
    if "float8" in host.dtype.name:  # ml_dtypes' float8 types have no torch counterpart in from_numpy
        return torch.from_numpy(host.view(np.uint8)).view(getattr(torch, host.dtype.name))
    return torch.from_numpy(host)
