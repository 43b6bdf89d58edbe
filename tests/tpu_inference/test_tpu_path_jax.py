"""The tpu-inference stack as locked can run on a TPU: every module its TPU path imports is installed."""

from __future__ import annotations

from .conftest import REPO, run_jax

# tpu-inference's Pallas kernels (attention, MoE, quantized matmul, collectives...), the layers, LoRA and
# speculative-decoding code that call them, and the runner and worker that drive them on a TPU.
TPU_PATH_ROOTS = ["tpu_inference.kernels.*", "tpu_inference.layers.*", "tpu_inference.lora.*",
                  "tpu_inference.spec_decode.*", "tpu_inference.runner.tpu_runner", "tpu_inference.worker.tpu_worker"]


def test_every_module_the_tpu_path_imports_is_installed(jax_env):
    result = run_jax(jax_env, REPO / "tests" / "helpers" / "tpu_imports.py", {"roots": TPU_PATH_ROOTS})
    assert result["failed"] == {}
    assert {"jax.experimental.pallas", "tpu_inference.kernels.fused_moe.v1.kernel"} <= set(result["imported"])
