"""vLLM general-plugin entry point (group `vllm.general_plugins`, name `aotc_jax_cpu_twin`: the name a pod's
VLLM_PLUGINS allow-list matches, kept from when the module served the twin alone) of the tpu-inference runner.

vLLM calls `register()` in every process it starts (API server, engine core, workers), before the model
runner is imported. Standard library only until it acts. It does four things:

* always, wherever tpu-inference is installed (a TPU pod too): collapse the flags tpu-inference prepends at
  import to one copy each (aotc/runners/flags.py), right after its `env_override` runs in this process, so
  `vllm serve` (API server + engine core) and an in-process `LLM(...)` hash the same XLA flags into JAX's
  cache keys. Nothing compiles before it: the engine core loads plugins before its executor starts.
* always, wherever tpu-inference is installed: the serving fixes (aotc/runners/tpu_inference/serving_fixes/),
  which move per-request bookkeeping the stack runs as eager device ops to the host, so the build, verify
  and a pod compile the same graphs and a pod nothing per request.
* always, wherever tpu-inference is installed: a dummy-weight engine's draft loads with dummy weights too
  (aotc/runners/tpu_inference/dummy_weights.py); with real weights it never acts.
* the CPU twin's patches, only when aotc asked for the twin (AOTC_CPU_TWIN=1, the flag both runners' twins
  share: each acts only in its own stack's venv): a real `vllm serve` on a TPU host must never see them.
"""

from __future__ import annotations

import importlib.util
import os

from aotc.runners.twin_flag import on_the_twin

# Prepends RunnerSpec.stack_flags to XLA_FLAGS / LIBTPU_INIT_ARGS when it runs, once per process.
FLAG_PREPENDER = "tpu_inference.env_override"


def register() -> None:
    collapse_stack_flags()
    if importlib.util.find_spec("tpu_inference") is None:
        return  # another stack's venv: there the twin flag asks for that stack's twin (vllm_tpu/twin/plugin.py)
    from .dummy_weights import install as install_dummy_draft
    from .serving_fixes import install as install_serving_fixes

    install_serving_fixes()
    install_dummy_draft()
    if not on_the_twin():
        return
    from .twin import install

    install()


def collapse_stack_flags() -> None:
    """Collapse tpu-inference's own flags in this process's environment (inherited by the processes it
    starts) once its env_override has run: now if it has, else right after it does."""
    if importlib.util.find_spec("tpu_inference") is None:
        return  # another stack's venv: nothing prepends
    from aotc.runners.watching import when_imported

    when_imported(FLAG_PREPENDER, _collapse)


def _collapse(_module=None) -> None:
    from aotc.runners.flags import collapse_flag_env

    from . import SPEC

    os.environ.update(collapse_flag_env(os.environ, SPEC.stack_flags))
