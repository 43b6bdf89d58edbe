"""The tpu-inference stack as locked can run on a TPU: every module its TPU path imports is installed."""

from __future__ import annotations


def test_every_module_the_tpu_path_imports_is_installed(stack_readers):
    # tpu-inference's Pallas kernels (attention, MoE, quantized matmul, collectives...), the layers, LoRA and
    # speculative-decoding code that call them, and the runner and worker that drive them on a TPU
    # (conftest.py: TPU_PATH_ROOTS, imported by tests/helpers/tpu_imports.py)
    result = stack_readers["../helpers/tpu_imports.py"]
    assert result["failed"] == {}
    assert {"jax.experimental.pallas", "tpu_inference.kernels.fused_moe.v1.kernel"} <= set(result["imported"])
