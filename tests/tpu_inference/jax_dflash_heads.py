"""Runs under the JAX venv (tests/tpu_inference/conftest.py: run_jax): what tpu-inference's DFlash drafter finds
when it looks up a target's lm_head to share (DFlashProposer.load_model: `_find_param(target_state,
TARGET_LM_HEAD_PATHS).value`), on the stack's own JAX model for each config, built abstract (no weights).

stdin: {"targets": [[model dir, tie_word_embeddings], ...]}
stdout (last line): {"heads": [{"architecture", "tied", "head_is_module"}, ...]}
"""

import json
import sys

import jax
import numpy as np
from flax import nnx
from tpu_inference.distributed.jax_parallel_state import init_pp_distributed_environment
from tpu_inference.layers.common.sharding import MESH_AXIS_NAMES_2D
from tpu_inference.models.common.model_loader import _get_model_architecture
from tpu_inference.spec_decode.jax.dflash import TARGET_LM_HEAD_PATHS, _find_param
from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config


def lm_head_lookup(model: str, tied: bool) -> dict:
    config = VllmConfig(model_config=ModelConfig(model=model, skip_tokenizer_init=True, max_model_len=128,
                                                 hf_overrides={"tie_word_embeddings": tied}))
    model_class = _get_model_architecture(config.model_config.hf_config)
    config.model_config.dtype = jax.numpy.bfloat16  # as get_flax_model hands it to the model
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), MESH_AXIS_NAMES_2D)
    with set_current_vllm_config(config), jax.set_mesh(mesh):
        abstract = nnx.eval_shape(lambda: model_class(config, jax.random.key(0), mesh))
    head = _find_param(nnx.state(abstract), TARGET_LM_HEAD_PATHS)
    return {"architecture": config.model_config.architectures[0], "tied": tied,
            "head_is_module": isinstance(head, nnx.State)}


init_pp_distributed_environment("", 0, 1, None, need_pp=False)  # one stage, as the runner's worker sets it
targets = json.load(sys.stdin)["targets"]
print(json.dumps({"heads": [lm_head_lookup(model, tied) for model, tied in targets]}))
