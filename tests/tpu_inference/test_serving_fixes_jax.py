"""The serving fixes (aotc/runners/tpu_inference/serving_fixes.py) compute what the stack's code computes:
each held against the tpu-inference function it replaces, under the JAX venv, over random inputs."""

from __future__ import annotations

import pytest

from .conftest import REPO, run_jax

SCRIPT = REPO / "tests" / "tpu_inference" / "jax_serving_fixes.py"
CASES = 150


@pytest.fixture(scope="module")
def compared(jax_env) -> dict:
    return run_jax(jax_env, SCRIPT, {"config": str(REPO / "configs" / "models" / "tiny-qwen2_5-vl"),
                                     "cases": CASES, "seed": 7})


def test_host_mrope_positions_equal_tpu_inferences(compared):
    """Text, images and videos at random places: the positions and delta of tpu-inference's Qwen2.5-VL
    get_mrope_input_positions, as a host array."""
    assert compared["mrope"] == [] and compared["host_types"] == ["numpy"]


def test_each_image_alone_gives_the_embeddings_the_stacks_concatenate_and_split_gives(compared):
    """Encoder batches of one to four images, pixels as one array, a list or a batch: the same per-image
    embeddings as tpu-inference's _parse_and_validate_image_input + _process_image_input."""
    assert compared["images"] == []


def test_one_buffer_equals_the_stacks_gathered_and_padded_pieces(compared):
    """Steps of random prefill chunks through prompts with images: the buffer equals tpu-inference's
    gather_mm_embeddings pieces after its flatten_pad_mm_embeds, row for row, and the mask is the stack's."""
    assert compared["gather"] == [] and compared["gathered_pieces"] > CASES // 2


def test_install_patches_once(compared):
    assert compared["patched"] and compared["cases"] == CASES
