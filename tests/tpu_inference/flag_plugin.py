"""Runs under the JAX venv (tests/tpu_inference/conftest.py: run_jax): a process that inherited ``environ`` (an
engine core started by an API server that imported tpu-inference once) imports tpu-inference, and aotc's plugin
registers before that import ("hook": it collapses right after env_override runs) or vLLM loads its general
plugins after it ("vllm": vLLM's own loader, through the installed entry points, as an engine core does).
No AOTC_CPU_TWIN: what a TPU pod runs.

stdin: {"environ": {...}, "order": "hook" | "vllm"}
stdout (last line): {"XLA_FLAGS": ..., "LIBTPU_INIT_ARGS": ..., "prepended_before_register": bool}
"""

import json
import os
import sys

payload = json.load(sys.stdin)
os.environ.update(payload["environ"])
if payload["order"] == "hook":
    from aotc.runners.tpu_inference import plugin

    prepended = "tpu_inference.env_override" in sys.modules
    plugin.register()
    import tpu_inference  # noqa: F401  (its env_override prepends the stack's flags)
else:
    import tpu_inference  # noqa: F401

    from vllm.plugins import load_general_plugins

    prepended = "tpu_inference.env_override" in sys.modules
    load_general_plugins()
print(json.dumps({"XLA_FLAGS": os.environ.get("XLA_FLAGS"), "LIBTPU_INIT_ARGS": os.environ.get("LIBTPU_INIT_ARGS"),
                  "prepended_before_register": prepended}))
