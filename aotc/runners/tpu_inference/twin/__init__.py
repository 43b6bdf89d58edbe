"""The CPU twin: tpu-inference on JAX's CPU backend, the few TPU-only facts the runner relies on replaced.

Everything else — the model, the runner, its `capture_model`, the sampler — is tpu-inference's own, so
the twin compiles the same families at the same paddings as a TPU host (as CPU executables). This module
holds the patches (`install`, which the plugin calls only under AOTC_CPU_TWIN=1); beside it, the
stand-ins for the stack's TPU-only kernels: attention (ragged paged, MLA, flash), moe (the grouped matmul),
gdn (the fused conv1d + gated delta rule) and deepseek (the JAX DeepSeek V3 at its config's sizes).

Every module of this package enters the fingerprint of a `device: cpu` entry (``RunnerSpec.twin_package``):
a module added here is hashed without being listed anywhere. Import-light: the standard library only at
module level (the plan side reads HBM_BYTES_ENV).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence

# Per-device "HBM", all of it free: what the stack's KV sizing fills on the twin (kv_sizer.py), so the block
# count it gives an entry is deterministic. Small, as the twin's cache lives in host memory; build, verify
# and the stock server then pin that count, whatever this says in their process.
HBM_BYTES_ENV = "AOTC_JAX_CPU_HBM_BYTES"
DEFAULT_HBM_BYTES = 64 << 20

# Modules whose jits name TPU compiler options literally, at class definition, rather than through
# compiler_options.get_* (patched below): the speculative drafters' propose steps.
LITERAL_TPU_OPTIONS_MODULES = ("tpu_inference.spec_decode.jax.eagle3", "tpu_inference.spec_decode.jax.dflash")
# The TPU backend's own options; XLA:CPU refuses them ("No such compile option").
TPU_OPTION_PREFIX = "xla_tpu_"

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


def jit_without_tpu_options(jit):
    """``jax.jit`` (called with a function or as a decorator factory) minus the TPU-only compiler options;
    every other argument, and so the graph, is the stack's."""

    @functools.wraps(jit)
    def wrapped(*args, **kwargs):
        options = kwargs.get("compiler_options")
        if options:
            kwargs["compiler_options"] = {k: v for k, v in options.items()
                                          if not k.startswith(TPU_OPTION_PREFIX)} or None
        return jit(*args, **kwargs)

    return wrapped


class _LoadWithoutTpuOptions(importlib.abc.Loader):
    """Runs a module's body with ``jax.jit`` as jit_without_tpu_options, then puts jax.jit back."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        import jax

        jit = jax.jit
        jax.jit = jit_without_tpu_options(jit)
        try:
            self.loader.exec_module(module)
        finally:
            jax.jit = jit


class _WithoutTpuOptionsFinder(importlib.abc.MetaPathFinder):
    """Loads LITERAL_TPU_OPTIONS_MODULES through _LoadWithoutTpuOptions when the runner first imports them."""

    def find_spec(self, name, path, target=None):
        if name not in LITERAL_TPU_OPTIONS_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _LoadWithoutTpuOptions(spec.loader)
        return spec


def installed() -> bool:
    return _installed


def install() -> None:
    """Patch tpu-inference before its model runner and sampler are imported (they bind at import)."""
    global _installed
    if _installed:
        return
    # loaded only where a TPU target is compiled
    compile_only = sys.modules.get("aotc.runners.tpu_inference.compile_only")
    if compile_only is not None and compile_only.installed():
        raise RuntimeError("this process compiles for a TPU (compile_only): the CPU twin's stand-ins must stay out")
    _installed = True
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    from tpu_inference import utils
    from tpu_inference.models.common import compiler_options

    sys.meta_path.insert(0, _WithoutTpuOptionsFinder())
    utils.make_optimized_mesh = cpu_mesh
    utils.hbm_usage_bytes = hbm_usage_bytes
    utils.get_device_hbm_limit = hbm_limit
    compiler_options.get_step_fn_compiler_options = no_compiler_options
    compiler_options.get_sampling_compiler_options = no_compiler_options

    _patch_attention()
    from . import deepseek, gdn, moe

    moe.install()
    deepseek.install()
    gdn.install()
    _patch_imported_names()


def _patch_attention() -> None:
    """The RPA kernels, in the shared attention interface and in the JAX models' own attention layers
    (Llama 4's, GPT-OSS's), which import them by name; the MLA kernel; the flash attention of vision
    encoders."""
    from tpu_inference.layers.common import attention_interface
    from tpu_inference.layers.jax.attention import attention as jax_attention
    from tpu_inference.layers.jax.attention import gpt_oss_attention

    from .attention import (flash_attention, mla_ragged_paged_attention, ragged_paged_attention,
                            ragged_paged_attention_hd64)

    attention_interface.flash_attention = flash_attention
    attention_interface.mla_ragged_paged_attention = mla_ragged_paged_attention

    for module in (attention_interface, jax_attention):
        module.ragged_paged_attention = ragged_paged_attention
    for module in (attention_interface, gpt_oss_attention):
        module.ragged_paged_attention_hd64 = ragged_paged_attention_hd64


def _patch_imported_names() -> None:
    """Modules that did `from ... import name` before install() keep the TPU function: rebind them."""
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
                         "tpu_inference.models.vllm.vllm_model_wrapper", *LITERAL_TPU_OPTIONS_MODULES)
             if n in sys.modules]
    if bound:
        # These pass compiler_options to jax.jit at import time; too late to patch.
        raise RuntimeError(f"aotc CPU twin installed after {bound} were imported")
