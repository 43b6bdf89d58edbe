"""The vision warm-up (precompile_vision_encoder) makes its dummy pixels with vLLM's torch dtype, which jnp refuses at
start-up; it runs with the JAX dtype the model was built with (Qwen2.5-VL's, the model whose warm-up has it).
"""

from __future__ import annotations

import functools

from .common import attribute_set


def in_the_models_dtype(precompile):
    """tpu-inference's get_flax_model gives the model config a JAX dtype while it builds the model and puts
    vLLM's torch dtype back after; the vision warm-up runs later and makes its dummy pixels with
    model_config.dtype, which jnp refuses (TypeError: Cannot interpret 'torch.bfloat16'), so a server with
    vision_warmup_config or enable_dynamic_image_sizes died at start-up. The warm-up runs with the dtype the
    model was built with: the pixels' dtype at serving (vLLM hands over bfloat16 pixels)."""

    @functools.wraps(precompile)
    def precompile_in_the_models_dtype(model, *args, **kwargs):
        from tpu_inference.utils import to_jax_dtype

        model_config = model.vllm_config.model_config
        with attribute_set(model_config, "dtype", to_jax_dtype(model_config.dtype)):
            return precompile(model, *args, **kwargs)

    return precompile_in_the_models_dtype
