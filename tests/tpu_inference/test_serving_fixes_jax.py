"""The serving fixes (aotc/runners/tpu_inference/serving_fixes.py) compute what the stack's code computes:
held against tpu-inference's own functions under the JAX venv."""

from __future__ import annotations

from .conftest import REPO, run_jax

SCRIPT = REPO / "tests" / "tpu_inference" / "jax_mrope.py"


def test_host_mrope_positions_equal_tpu_inferences_over_random_prompts(jax_env):
    """Text, images and videos at random places: the same positions and delta as tpu-inference's
    Qwen2.5-VL get_mrope_input_positions, as a host array; install() puts it on the model class."""
    result = run_jax(jax_env, SCRIPT, {"config": str(REPO / "configs" / "models" / "tiny-qwen2_5-vl"), "cases": 300,
                                       "seed": 7})
    assert result["cases"] == 300 and result["mismatches"] == [], result["mismatches"][:5]
    assert result["host_types"] == ["numpy"] and result["patched"]
