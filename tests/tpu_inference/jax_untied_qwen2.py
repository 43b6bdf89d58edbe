"""Runs under the JAX venv (tests/tpu_inference/conftest.py: run_jax): whether tpu-inference's JAX Qwen2 reads
hf_config.text_config (for an untied lm_head), and whether the model's Qwen2 config has one and is untied.

stdin: {"model": model dir}
stdout (last line): {"reads_text_config", "has_text_config", "tied"}
"""

import inspect
import json
import sys

from tpu_inference.models.jax.qwen2 import Qwen2ForCausalLM
from transformers import AutoConfig

config = AutoConfig.from_pretrained(json.load(sys.stdin)["model"])
print(json.dumps({"reads_text_config": "hf_config.text_config.hidden_size" in inspect.getsource(Qwen2ForCausalLM.__init__),
                  "has_text_config": hasattr(config, "text_config"), "tied": config.tie_word_embeddings}))
