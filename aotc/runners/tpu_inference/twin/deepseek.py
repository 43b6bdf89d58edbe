"""The CPU twin's DeepSeek V3: the JAX model built at the sizes its config gives.

tpu-inference 0.32's JAX DeepSeek V3 (tpu_inference/models/jax/deepseek_v3.py) takes only the layer count
from the config; every other size is a module constant with DeepSeek V3's value ("TODO: read these configs
from HF config"), read when the model is built. For DeepSeek V3 itself (and R1, V3.1, which share its
sizes) the constants are the config's values, and `aotc plan` refuses a `device: tpu` entry of other sizes
(rules.jax_deepseek_v3, whose copy of the constants tests hold equal to the stack's). The twin's tiny config
needs its own sizes: each constant is set from the config before the model is built. The router's
`topk_groups=4` is a literal, not a constant: the tiny config keeps DeepSeek V3's 4 of 8.
"""

from __future__ import annotations

import functools

from ..plan.rules import JAX_DEEPSEEK_V3_CONSTANTS, deepseek_config_value

MODULE = "tpu_inference.models.jax.deepseek_v3"
INSTALLED = "_aotc_sizes_from_config"


def install() -> None:
    from aotc.runners.watching import when_imported

    when_imported(MODULE, _build_at_config_sizes)


def config_sizes(config) -> dict:
    """The module's constants as `config` (a DeepSeek V3 config object or its config.json) gives them."""
    return {constant: deepseek_config_value(config, key)
            for constant, (key, _) in JAX_DEEPSEEK_V3_CONSTANTS.items() if constant is not None}


def _build_at_config_sizes(module) -> None:
    init = module.DeepSeekV3.__init__
    if getattr(init, INSTALLED, False):
        return

    @functools.wraps(init)
    def init_at_config_sizes(self, vllm_config, *args, **kwargs):
        for constant, value in config_sizes(vllm_config.model_config.hf_config).items():
            setattr(module, constant, value)
        init(self, vllm_config, *args, **kwargs)

    setattr(init_at_config_sizes, INSTALLED, True)
    module.DeepSeekV3.__init__ = init_at_config_sizes
