"""Runs under the JAX venv (tests/tpu_inference/conftest.py: run_jax): tpu-inference's JAX DeepSeek V3 module
constants, what the twin reads from a V3-sized config, and whether the model routes over a literal 4 groups and
loads only a quantized checkpoint.

stdin: {"constants": [name, ...], "v3_config": [[key, value], ...]}
stdout (last line): {"constants", "twin_reads", "topk_groups_literal", "asserts_quantization"}
"""

import inspect
import json
import sys

from tpu_inference.models.jax import deepseek_v3

from aotc.runners.tpu_inference.twin.deepseek import config_sizes

request = json.load(sys.stdin)
v3_config = {key: value for key, value in request["v3_config"]}
print(json.dumps({"constants": {name: getattr(deepseek_v3, name) for name in request["constants"]},
                  "twin_reads": config_sizes(v3_config),
                  "topk_groups_literal": "topk_groups=4," in inspect.getsource(deepseek_v3.DeepseekV2Moe.__init__),
                  "asserts_quantization": "assert self.quant_config is not None"
                                          in inspect.getsource(deepseek_v3.MLAEinsum.load_weights)}))
