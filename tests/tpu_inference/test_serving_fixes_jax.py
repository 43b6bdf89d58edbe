"""The serving fixes (aotc/runners/tpu_inference/serving_fixes/) compute what the stack's code computes:
each held against the tpu-inference function it replaces, under the JAX venv, over random inputs."""

from __future__ import annotations

import pytest

from .conftest import REPO, run_jax

SCRIPT = REPO / "tests" / "tpu_inference" / "jax_serving_fixes.py"
# random cases per check; 150 and 24 took 195 s of the suite's time, 43 s of it Qwen's M-RoPE and 113 s the
# padded images, each of which runs the stack's eager aux arrays at new shapes (an XLA compile per op)
CASES = 75
PADDED_CASES = 12


@pytest.fixture(scope="module")
def compared(jax_env) -> dict:
    return run_jax(jax_env, SCRIPT, {"config": str(REPO / "configs" / "models" / "tiny-qwen2_5-vl"),
                                     "cases": CASES, "padded_cases": PADDED_CASES, "seed": 7})


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


def test_padded_encoder_inputs_equal_the_stacks_eager_ones(compared):
    """Images of random grids with enable_dynamic_image_sizes: the host-built window index, rotary table and
    sequence bounds, padded to the patch bucket, equal tpu-inference's compute_aux_arrays + pad_inputs array
    for array and dtype for dtype, and the padded output's image rows equal its sliced output."""
    assert compared["padded_images"] == [] and compared["patch_buckets"] >= 4


def test_gemma4_images_each_alone_on_host_equal_the_stacks_batch(compared):
    """Gemma 4 encoder batches of one to three images (one tensor when they share a soft-token budget, a list
    when not): each image's rows equal tpu-inference's parse + process of that image alone and of the batch."""
    assert compared["gemma4_images"] == []


def test_llama_guard_4_images_each_by_its_tiles_equal_the_stacks_batch(compared):
    """Llama Guard 4 encoder batches of one to three images of 1 to 5 tiles: each image's rows, the tiles' tokens in
    order, equal what tpu-inference's embed_multimodal splits off for it from the whole batch."""
    assert compared["llama_guard_4_images"] == []


def test_llava_merge_in_order_equals_vllms_and_takes_the_one_buffer_under_jit(compared):
    """LLaVA on the torchax path: vLLM's own merge over the stack's pieces equals the fix's merge, over those
    pieces and, jitted under torchax, over the fix's one buffer; vLLM's merge run eagerly under torchax (the stack's
    way for other vLLM models) misplaces that buffer's rows, so those models keep their pieces."""
    assert compared["torchax_merge"] == [] and compared["one_buffer_misplaced"] > CASES // 4


def test_llava_images_each_alone_equal_the_stacks_batch_and_other_vllm_models_keep_the_stacks(compared):
    """Encoder batches of one to four images: each image's rows through the fix equal the batch's, as the runner
    takes them; a vLLM model other than LLaVA and Qwen3-VL keeps the stack's unjitted functions and gather's own
    pieces, Qwen3-VL its tower; Qwen3-VL's jitted embedding traces with no deepstack rows of an earlier step and
    leaves none behind; Qwen3.5's, whose module imported vLLM's merge, places the one buffer's rows in order (vLLM's
    merge, jitted as it is, does not)."""
    assert compared["torchax_images"] == []


def test_install_patches_once(compared):
    assert compared["patched"] and compared["cases"] == CASES


def test_qwen3_vl_budget_outputs_kept_whole_give_the_buffer_the_stacks_slices_give(compared):
    """Qwen3-VL's encoder batches packed into token budgets (one to three images a budget, padding after them):
    the one buffer the fix gathers from each budget's whole output and its image's place in it equals what the
    stack's gather and padding make of the rows its MMEncoderJITManager slices per image; some budgets are shared."""
    assert compared["budget_outputs"] == [] and compared["shared_budgets"] > 0


def test_every_fix_module_is_in_the_registry():
    """The registry (serving_fixes.PATCHES) installs each model's fix: a fix module (one with `fix`) left out of it
    would never run in a pod."""
    import importlib
    import pkgutil

    from aotc.runners.tpu_inference import serving_fixes

    fix_modules = {info.name for info in pkgutil.iter_modules(serving_fixes.__path__)
                   if hasattr(importlib.import_module(f"{serving_fixes.__name__}.{info.name}"), "fix")}
    assert sorted(serving_fixes.PATCHES.values()) == sorted(fix_modules)
