"""tpu-inference on JAX's CPU backend: the few TPU-only facts the runner relies on, replaced.

Everything else — the model, the runner, its `capture_model`, the sampler — is tpu-inference's own, so
the twin compiles the same families at the same paddings as a TPU host (as CPU executables).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

# Per-device "HBM": only bounds vLLM's KV budget. Build and verify must agree on it, because the KV
# cache's page count is a shape in every backbone graph.
HBM_BYTES_ENV = "AOTC_JAX_CPU_HBM_BYTES"
DEFAULT_HBM_BYTES = 1 << 30

_installed = False


def hbm_limit() -> int:
    return int(os.environ.get(HBM_BYTES_ENV) or DEFAULT_HBM_BYTES)


def cpu_mesh(axis_shapes: Sequence[int], axis_names: Sequence[str], *, devices=None):
    """make_optimized_mesh without the TPU topology: CPU devices have no `coords`."""
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    devices = sorted(devices if devices is not None else jax.devices(), key=lambda d: d.id)
    count = int(np.prod(axis_shapes))
    grid = np.array(devices[:count]).reshape(tuple(axis_shapes))
    return Mesh(grid, tuple(axis_names), axis_types=(AxisType.Auto,) * len(axis_shapes))


def hbm_usage_bytes(devices) -> list[tuple[int, int]]:
    # Nothing "used": the budget is the same at build and at verify, whatever was loaded first.
    return [(0, hbm_limit()) for _ in devices]


def no_compiler_options() -> dict[str, str]:
    """The TPU backend's compiler options; XLA:CPU rejects unknown ones."""
    return {}


def install() -> None:
    """Patch tpu-inference before its model runner and sampler are imported (they bind at import)."""
    global _installed
    if _installed:
        return
    _installed = True
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    from tpu_inference import utils
    from tpu_inference.models.common import compiler_options

    utils.make_optimized_mesh = cpu_mesh
    utils.hbm_usage_bytes = hbm_usage_bytes
    utils.get_device_hbm_limit = hbm_limit
    compiler_options.get_step_fn_compiler_options = no_compiler_options
    compiler_options.get_sampling_compiler_options = no_compiler_options

    _patch_attention()
    from . import twin_moe

    twin_moe.install()
    _patch_imported_names()


def _patch_attention() -> None:
    """The RPA kernels, in the shared attention interface and in the JAX models' own attention layers
    (Llama 4's, GPT-OSS's), which import them by name; the flash attention of vision encoders."""
    from tpu_inference.layers.common import attention_interface
    from tpu_inference.layers.jax.attention import attention as jax_attention
    from tpu_inference.layers.jax.attention import gpt_oss_attention

    from .twin_attention import flash_attention, ragged_paged_attention, ragged_paged_attention_hd64

    attention_interface.flash_attention = flash_attention

    for module in (attention_interface, jax_attention):
        module.ragged_paged_attention = ragged_paged_attention
    for module in (attention_interface, gpt_oss_attention):
        module.ragged_paged_attention_hd64 = ragged_paged_attention_hd64


def _patch_imported_names() -> None:
    """Modules that did `from ... import name` before install() keep the TPU function: rebind them."""
    import sys

    replacements = {"make_optimized_mesh": cpu_mesh, "hbm_usage_bytes": hbm_usage_bytes,
                    "get_device_hbm_limit": hbm_limit,
                    "get_step_fn_compiler_options": no_compiler_options,
                    "get_sampling_compiler_options": no_compiler_options}
    for name, module in list(sys.modules.items()):
        if not name.startswith("tpu_inference") or module is None:
            continue
        for attr, fn in replacements.items():
            if attr in vars(module) and getattr(module, attr) is not fn:
                setattr(module, attr, fn)
    bound = [n for n in ("tpu_inference.layers.jax.sample.sampling", "tpu_inference.runner.decode_loop",
                         "tpu_inference.models.vllm.vllm_model_wrapper") if n in sys.modules]
    if bound:
        # These pass compiler_options to jax.jit at import time; too late to patch.
        raise RuntimeError(f"aotc CPU twin installed after {bound} were imported")
