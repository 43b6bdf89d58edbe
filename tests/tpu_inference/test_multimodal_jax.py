"""A vision-language model end to end on the CPU twin, through the real CLI: the tiny Qwen2.5-VL of
configs/multimodal-jax.yaml builds every planned graph (the input-embeddings merger and the backbone over input
embeddings, tests/tpu_inference/test_plan_jax.py tying them to tpu-inference's own capture_model; beyond the
warm-up what a step with image embeddings runs under aotc's serving fixes), then a fresh server's verify under
text and image traffic finds every graph in the artifact, and the stock server under chat requests with images
compiles nothing after ready; with images by grid, with images of any size (enable_dynamic_image_sizes), on
Gemma 4 (its encoder per soft-token budget), on Llama Guard 4 (its encoder per tile count) and on LLaVA through
tpu-inference's torchax path (vLLM's model, its tower and input embedding jitted by the fixes). One build of the
matrix, shared.

Zero depends on the serving fixes (aotc/runners/tpu_inference/serving_fixes/, held equal to the stack's code by
test_serving_fixes_jax.py): without them tpu-inference slices, joins and pads each request's M-RoPE positions,
pixels and image embeddings as eager device ops, shaped by the prompt and the batch.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from aotc.graphs import GraphSpec
from aotc.entry import hf_config
from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from aotc.runners.tpu_inference.plan import buckets, gemma4_vision, llama_guard_4, qwen3_vl
from aotc.runners.tpu_inference.plan.buckets import image_max_patches, large_image_encoder_graphs
from tests.conftest import run_aotc
from tests.support_cases import MULTIMODAL_JAX_WITHOUT_CANARY

from .conftest import REPO, run_jax

CONFIG = REPO / "configs" / "multimodal-jax.yaml"
# Qwen2.5-VL with images by grid, and of any size (enable_dynamic_image_sizes); Gemma 4; Llama Guard 4; LLaVA;
# Qwen3-VL; Qwen3-VL MoE; Qwen3.5
EVERY_ENTRY = load_matrix(CONFIG, check_stack=False).entries
ENTRY, DYNAMIC, GEMMA4, LLAMA_GUARD_4, LLAVA, QWEN3_VL, QWEN3_VL_MOE, QWEN3_5 = EVERY_ENTRY
MULTIMODAL_FAMILIES = {"input_embeddings_merger", "input_embeddings_merger_text_only", "backbone_with_embeds"}


@pytest.fixture(scope="module")
def built(jax_env, tmp_path_factory) -> dict[str, tuple[Path, dict, Path]]:
    """Each entry's build and a store holding it, from one build of the matrix."""
    from tests.helpers.canary import publish_copy

    out = tmp_path_factory.mktemp("multimodal")
    proc = run_aotc("build", CONFIG, "--out", out, "--traffic", "8", "--no-reuse", "--json", env=jax_env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = {report["entry"]: report for report in json.loads(proc.stdout)["entries"]}
    return {name: (out / name, report, publish_copy(out / name, tmp_path_factory.mktemp("store"), jax_env)[0])
            for name, report in reports.items()}


def test_multimodal_plan_lists_the_vision_families_once_per_shape():
    plan = plan_entry(ENTRY)
    assert MULTIMODAL_FAMILIES <= set(plan.families())
    assert "vision_encoder" not in plan.families()  # no warm-up image shapes: the stack compiles none
    assert plan.families()["backbone_with_embeds"] == len(plan.buckets["token_paddings"])


def test_multimodal_plan_lists_a_step_with_images_per_token_bucket_and_image_grid():
    """Beyond the warm-up: the encoder per image grid the traffic sends (56x56 and 112x84 pixels in 14-pixel
    patches), per token bucket the mask and the buffer, per bucket and grid the copy of the encoder rows; no
    M-RoPE family (the positions are host arrays)."""
    plan = plan_entry(ENTRY)
    tokens, grids = plan.buckets["token_paddings"], ["1x4x4", "1x8x6"]
    beyond = {g.family for g in plan.graphs if g.beyond_warmup}
    assert beyond == {"image_encoder", "multimodal_mask", "empty_embedding_rows", "place_encoder_rows"}
    shapes = {family: sorted(tuple(sorted(g.shape_dict.items())) for g in plan.graphs if g.family == family)
              for family in beyond}
    assert shapes["image_encoder"] == [(("image_grid", g),) for g in grids]
    assert shapes["multimodal_mask"] == shapes["empty_embedding_rows"] == [(("num_tokens", t),) for t in tokens]
    assert shapes["place_encoder_rows"] == sorted((("image_grid", g), ("num_tokens", t)) for t in tokens for g in grids)


def test_dynamic_image_sizes_plan_a_step_with_images_per_token_bucket_and_patch_bucket():
    """With enable_dynamic_image_sizes the stack's warm-up compiles the padded encoder per power-of-two patch
    count (test_plan_jax.py ties it to its capture_model); beyond it, the copy of an image's rows is planned per
    token bucket and padded encoder output (its rows: the patch count over the merge), whatever the image's
    size, and no encoder per image grid."""
    plan = plan_entry(DYNAMIC)
    tokens = plan.buckets["token_paddings"]
    patches = [g.shape_dict["num_patches"] for g in plan.graphs if g.family == "vision_encoder_padded"]
    assert patches and "image_encoder" not in plan.families()
    rows = sorted(tuple(sorted(g.shape_dict.items())) for g in plan.graphs if g.family == "place_encoder_rows")
    assert rows == sorted((("encoder_rows", n // 4), ("num_tokens", t)) for t in tokens for n in patches)
    assert {g.family for g in plan.graphs if g.beyond_warmup} == {"vision_encoder_padded", "multimodal_mask",
                                                                  "empty_embedding_rows", "place_encoder_rows"}


def test_images_above_the_step_budget_plan_the_padded_encoder_the_warmup_stops_short_of():
    """The entry's processor takes images up to 224 x 224 pixels (256 patches) while a step holds 32 tokens (128
    patches, where the stack's warm-up stops): the 256-patch encoder is planned beyond the warm-up, and the
    sweep sends images that reach it."""
    plan = plan_entry(DYNAMIC)
    warmup = [g.shape_dict["num_patches"] for g in plan.graphs if g.family == "vision_encoder_padded"
              and not g.beyond_warmup]
    beyond = [g.shape_dict["num_patches"] for g in plan.graphs if g.family == "vision_encoder_padded"
              and g.beyond_warmup]
    largest = DYNAMIC.engine["mm_processor_kwargs"]["max_pixels"] // 14 ** 2
    assert max(warmup) == DYNAMIC.max_num_batched_tokens * 4 < largest
    assert beyond == [n for n in (max(warmup) * 2 ** i for i in range(1, 8)) if n // 2 < largest]
    sent = DYNAMIC.backend.planner.traffic_images(DYNAMIC, hf_config(DYNAMIC))
    assert any(max(warmup) < h * w // 14 ** 2 <= largest for h, w, _ in sent)
    assert not large_image_encoder_graphs(ENTRY, hf_config(ENTRY))  # images by grid: no padded encoder


# Qwen2.5-VL's processor bounds: the model's own, and mm_processor_kwargs' (max_model_len 128 throughout)
QWEN_BOUNDS = [[128, None], [128, {"max_pixels": 50176}],
               [128, {"size": {"longest_edge": 50176, "shortest_edge": 3136}}],
               [128, {"max_pixels": 100000}], [128, {"max_pixels": 1000000}]]
# Gemma 4's images beyond the sweep's: very wide, and large
GEMMA4_SIZES = [list(s) for s in gemma4_vision.IMAGE_SHAPES] + [[16, 900], [500, 333]]
# Llama Guard 4's images beyond the sweep's: smaller than a tile, very wide, very tall, between tiles, very large
LLAMA_GUARD_4_SIZES = [[20, 20], [56, 500], [500, 56], [300, 200], [113, 57], [1000, 1000]]


@pytest.fixture(scope="module")
def processors(jax_env) -> dict:
    """vLLM-TPU's own processors on the tiny models (tests/tpu_inference/jax_processors.py), in one process."""
    guard = hf_config(LLAMA_GUARD_4)
    guard_sizes = [[h, w] for h, w, _ in llama_guard_4.traffic_images(LLAMA_GUARD_4, guard)] + LLAMA_GUARD_4_SIZES
    return run_jax(jax_env, Path(__file__).with_name("jax_processors.py"), {
        "qwen": [str(ENTRY.model_path), QWEN_BOUNDS],
        "gemma4": [str(GEMMA4.model_path), GEMMA4.max_model_len,
                   gemma4_vision.soft_token_budgets(GEMMA4, hf_config(GEMMA4)), GEMMA4_SIZES],
        "llama_guard_4": [str(LLAMA_GUARD_4.model_path), LLAMA_GUARD_4.max_model_len, guard_sizes]})


def test_the_largest_image_is_vllms_own_bound(processors):
    """image_max_patches over merge**2 is the most tokens vLLM-TPU's processor gives one image (what its encoder
    budget is sized by), from the model's preprocessor_config.json or mm_processor_kwargs, up to what
    max_model_len can hold."""
    for (max_len, kwargs), theirs in zip(QWEN_BOUNDS, processors["qwen"], strict=True):
        entry = dataclasses.replace(DYNAMIC, max_model_len=max_len,
                                    engine={**DYNAMIC.engine, "mm_processor_kwargs": kwargs})
        assert image_max_patches(entry, hf_config(entry)) // 4 == min(theirs, max_len), (kwargs, theirs)


def test_gemma4_plans_its_encoder_per_soft_token_budget_and_nothing_per_image():
    """Gemma 4 beyond the warm-up: the encoder at each budget up to the processor's own (140 tokens; 70 on
    request), per token bucket the mask and the buffer, per bucket and budget the copy of the encoder rows; no
    encoder per image size (its processor pads every image to its budget) and none in the warm-up."""
    plan = plan_entry(GEMMA4)
    tokens, budgets = plan.buckets["token_paddings"], [70, 140]
    assert MULTIMODAL_FAMILIES <= set(plan.families())
    beyond = {g.family for g in plan.graphs if g.beyond_warmup}
    assert beyond == {"image_encoder", "multimodal_mask", "empty_embedding_rows", "place_encoder_rows"}
    assert not {"vision_encoder", "vision_encoder_padded"} & set(plan.families())
    assert sorted(g.shape_dict["soft_tokens"] for g in plan.graphs if g.family == "image_encoder") == budgets
    rows = sorted(tuple(sorted(g.shape_dict.items())) for g in plan.graphs if g.family == "place_encoder_rows")
    assert rows == sorted((("encoder_rows", n), ("num_tokens", t)) for t in tokens for n in budgets)
    # a budget whose image cannot fit max_model_len is not reachable
    short = dataclasses.replace(GEMMA4, max_model_len=128, max_num_batched_tokens=128)
    assert gemma4_vision.soft_token_budgets(short, hf_config(short)) == [70]


@pytest.mark.parametrize("setting, reason", [
    ({"additional_config": {"vision_warmup_config": {"image_shapes": [[224, 224]]}}}, "4-D pixels"),
    ({"compilation_config": {"cudagraph_mm_encoder": True}}, "cudagraph_mm_encoder")])
def test_gemma4_refuses_the_encoder_settings_the_stack_cannot_start_or_the_plan_does_not_follow(setting, reason):
    entry = dataclasses.replace(GEMMA4, engine={**GEMMA4.engine, **setting})
    with pytest.raises(ValueError, match=reason):
        plan_entry(entry)


def test_gemma4_with_an_audio_tower_is_refused_in_one_line():
    refusals = GEMMA4.backend.validate(GEMMA4, {**hf_config(GEMMA4), "audio_config": {"hidden_size": 32}})
    assert [line for line in refusals if "audio tower" in line] == refusals[:1] and refusals[0].startswith("model: ")
    # image-only Gemma 4 configs carry it as null
    assert GEMMA4.backend.validate(GEMMA4, {**hf_config(GEMMA4), "audio_config": None}) == []


def test_gemma4_encoder_shape_follows_the_budget_not_the_image(processors):
    """Gemma 4's own processor (vLLM-TPU's venv) pads images of any size and aspect to budget x pooling**2
    patches, and gives each at most the budget's tokens: one encoder graph and one encoder-row count per budget.
    The budget an entry serves by default is vLLM's own largest image (its encoder budget)."""
    config = hf_config(GEMMA4)
    budgets, theirs = gemma4_vision.soft_token_budgets(GEMMA4, config), processors["gemma4"]
    vision = config["vision_config"]
    assert theirs["most_tokens"] == gemma4_vision.processor_soft_tokens(GEMMA4, config) == max(budgets)
    for budget in budgets:
        patches = budget * vision["pooling_kernel_size"] ** 2
        assert theirs["patches"][str(budget)] == [[1, patches, 3 * vision["patch_size"] ** 2]] * len(GEMMA4_SIZES)
        assert all(0 < n <= budget for n in theirs["tokens"][str(budget)]), theirs["tokens"]
    sent = gemma4_vision.traffic_images(GEMMA4, config)
    assert all(tokens >= max(budgets) for _, _, tokens in sent)


def test_llama_guard_4_plans_its_encoder_per_tile_count_and_nothing_per_image():
    """Llama Guard 4 beyond the warm-up: the encoder at each tile count an image can have (one tile, or a canvas
    of 2 to max_patches = 4 tiles and the global one), per token bucket the mask and the buffer, per bucket and
    tile count the copy of its rows (4 tokens a tile); no encoder in the warm-up unless vision_warmup_config
    names the tile's shape."""
    plan = plan_entry(LLAMA_GUARD_4)
    tokens, tiles = plan.buckets["token_paddings"], llama_guard_4.tile_counts(LLAMA_GUARD_4, hf_config(LLAMA_GUARD_4))
    assert MULTIMODAL_FAMILIES <= set(plan.families()) and tiles == [1, 3, 4, 5]
    assert {g.family for g in plan.graphs if g.beyond_warmup} == {"image_encoder", "multimodal_mask",
                                                                  "empty_embedding_rows", "place_encoder_rows"}
    assert sorted(g.shape_dict["image_tiles"] for g in plan.graphs if g.family == "image_encoder") == tiles
    rows = sorted(tuple(sorted(g.shape_dict.items())) for g in plan.graphs if g.family == "place_encoder_rows")
    assert rows == sorted((("encoder_rows", 4 * n), ("num_tokens", t)) for t in tokens for n in tiles)
    assert "vision_encoder_projector" not in plan.families()
    warm = dataclasses.replace(LLAMA_GUARD_4, engine={**LLAMA_GUARD_4.engine, "additional_config": {
        "vision_warmup_config": {"image_shapes": [[56, 56]]}}})
    assert plan_entry(warm).families()["vision_encoder_projector"] == 1
    # an image whose tiles cannot fit max_model_len is not reachable
    short = dataclasses.replace(LLAMA_GUARD_4, max_model_len=20)
    assert llama_guard_4.tile_counts(short, hf_config(short)) == [1, 3]


def test_llama_guard_4_refuses_warmup_shapes_its_tower_cannot_run():
    entry = dataclasses.replace(LLAMA_GUARD_4, engine={**LLAMA_GUARD_4.engine, "additional_config": {
        "vision_warmup_config": {"image_shapes": [[224, 224]]}}})
    with pytest.raises(ValueError, match=r"56 x 56 tiles"):
        plan_entry(entry)


def test_llama_guard_4_tile_counts_are_vllms_own(processors):
    """vLLM-TPU's own Llama 4 processor, on images of many sizes and aspects: every image's tile count is a planned
    one, with tokens_per_tile embedding rows a tile (the rows place_encoder_rows is planned for) and the prompt
    length the plan bounds tile counts by; the sweep's images reach every planned count, in order; vLLM's
    largest image (its encoder budget) is the largest planned count's rows."""
    config, theirs = hf_config(LLAMA_GUARD_4), processors["llama_guard_4"]
    sent = llama_guard_4.traffic_images(LLAMA_GUARD_4, config)
    tiles, per_tile = llama_guard_4.tile_counts(LLAMA_GUARD_4, config), llama_guard_4.tokens_per_tile(config)
    assert [[count, length] for count, _, length in theirs["images"][:len(sent)]] == [
        [n, tokens] for n, (_, _, tokens) in zip(tiles, sent)]
    for count, rows, length in theirs["images"]:
        assert count in tiles and rows == count * per_tile and length == llama_guard_4.prompt_tokens(count, per_tile)
    assert theirs["most_tokens"] == max(tiles) * per_tile


def test_llava_plans_its_one_size_tower_and_the_image_step_per_token_bucket():
    """LLaVA through torchax: no encoder warm-up; beyond it the tower at the processor's one size, and per token
    bucket the image step's families, an image's output being image_tokens rows (vLLM's own count:
    tests/vllm_tpu/test_multimodal.py)."""
    from aotc.runners import llava

    config = hf_config(LLAVA)
    plan = plan_entry(LLAVA)
    tokens = plan.buckets["token_paddings"]
    beyond = {g.key for g in plan.graphs if g.beyond_warmup}
    side = config["vision_config"]["image_size"]
    expected = {GraphSpec.of("image_encoder", True, image_shape=f"{side}x{side}").key}
    rows = llava.image_tokens(config)
    for t in tokens:
        expected |= {GraphSpec.of(f, True, num_tokens=t).key for f in ("multimodal_mask", "empty_embedding_rows")}
        expected.add(GraphSpec.of("place_encoder_rows", True, num_tokens=t, encoder_rows=rows).key)
    assert beyond == expected
    assert not set(plan.families()) & {"vision_encoder", "vision_encoder_padded"}


def test_qwen3_vl_plans_its_tower_per_token_budget_and_nothing_per_image():
    """Qwen3-VL through torchax with cudagraph_mm_encoder: the warm-up's tower per token budget (its budgets tied to
    vLLM's own derivation by test_plan_jax.py); beyond it per token bucket the image step's families, an image's
    encoder output being its budget's rows; no encoder per image grid or size."""
    plan = plan_entry(QWEN3_VL)
    budgets = qwen3_vl.budgets(QWEN3_VL)
    assert budgets == [64, 128]  # min(max_num_batched_tokens, max_model_len) = 128: two images share a budget
    assert [g.key for g in plan.graphs if g.family == "mm_encoder_jit"] == [
        GraphSpec.of("mm_encoder_jit", budget=b).key for b in budgets]
    beyond = {g.key for g in plan.graphs if g.beyond_warmup}
    expected = set()
    for t in plan.buckets["token_paddings"]:
        expected |= {GraphSpec.of(f, True, num_tokens=t).key for f in ("multimodal_mask", "empty_embedding_rows")}
        expected |= {GraphSpec.of("place_encoder_rows", True, num_tokens=t, encoder_rows=b).key for b in budgets}
    assert beyond == expected
    assert not set(plan.families()) & {"image_encoder", "vision_encoder", "vision_encoder_padded"}
    sent = QWEN3_VL.backend.planner.traffic_images(QWEN3_VL, hf_config(QWEN3_VL))
    assert len({tokens for _, _, tokens in sent}) >= 4  # a spread of sizes, each within the smallest budget


def test_qwen3_vl_moe_plans_what_qwen3_vl_does_at_its_shapes():
    """Qwen3-VL MoE differs from Qwen3-VL in its text model only, whose experts run inside the backbone's graphs
    (tpu-inference's fused MoE): its plan is Qwen3-VL's at the same step and length, one budget at a 64-token
    step."""
    dense = dataclasses.replace(QWEN3_VL, max_model_len=QWEN3_VL_MOE.max_model_len,
                                max_num_batched_tokens=QWEN3_VL_MOE.max_num_batched_tokens)
    assert [g.key for g in plan_entry(QWEN3_VL_MOE).graphs] == [g.key for g in plan_entry(dense).graphs]
    assert qwen3_vl.budgets(QWEN3_VL_MOE) == [64]
    assert hf_config(QWEN3_VL_MOE)["text_config"]["num_experts"] > 1


def test_cosmos3_plans_what_qwen3_vl_does():
    """Cosmos 3's reasoner is vLLM's subclass of Qwen3-VL's model changing only its weight-name mapping (no method:
    test_plan_jax.py), over a Qwen3-VL text and vision config: its plan is Qwen3-VL's at the same entry."""
    tiny = REPO / "configs" / "models" / "tiny-cosmos3"
    cosmos3 = dataclasses.replace(QWEN3_VL, model=str(tiny), model_path=str(tiny))
    assert hf_config(cosmos3)["architectures"] == ["Cosmos3ForConditionalGeneration"]
    assert [g.key for g in plan_entry(cosmos3).graphs] == [g.key for g in plan_entry(QWEN3_VL).graphs]


def test_qwen3_5_plans_what_qwen3_vl_does_at_its_shapes():
    """Qwen3.5 runs Qwen3-VL's tower (no deepstack levels) through the stack's budget manager and its own input
    embedding, jitted by the fixes per token bucket; its linear-attention layers' state slots are backbone inputs,
    not shapes: its plan is Qwen3-VL's at the same step and length."""
    dense = dataclasses.replace(QWEN3_VL, max_model_len=QWEN3_5.max_model_len,
                                max_num_batched_tokens=QWEN3_5.max_num_batched_tokens)
    assert [g.key for g in plan_entry(QWEN3_5).graphs] == [g.key for g in plan_entry(dense).graphs]
    text = hf_config(QWEN3_5)["text_config"]
    assert "linear_attention" in text["layer_types"]
    assert hf_config(QWEN3_5)["vision_config"]["deepstack_visual_indexes"] == []  # as Qwen3.5's checkpoints ship it


def test_the_serving_fixes_jit_the_merge_of_every_architecture_planned_as_qwen3_vl():
    """The fixes run in the stack's process and name the classes themselves: the set the plan follows on Qwen3-VL's
    path and the set whose input embedding the fixes jit (aotc's one-buffer place_encoder_rows) are one."""
    from aotc.runners.tpu_inference.serving_fixes import qwen3_vl as qwen3_vl_fix

    assert qwen3_vl_fix.JITTED_TORCHAX_MERGES_ONLY == qwen3_vl.ARCHITECTURES


@pytest.mark.parametrize("limits, images", [
    ({"image": 0, "video": 0}, False), ({"image": 0}, False), ({"image": {"count": 0}, "video": 0}, False),
    ({}, True), ({"image": 1, "video": 0}, True), ({"image": 0, "video": 1}, True)])
def test_a_multimodal_model_takes_images_unless_every_modality_limit_listed_is_zero(limits, images):
    """The stack's own rule (TPUModelRunner.load_model; test_plan_jax.py holds it to the stack's code): a modality
    the engine leaves out counts 999 to vLLM but not to that rule."""
    entry = dataclasses.replace(QWEN3_5, engine={**QWEN3_5.engine, "limit_mm_per_prompt": limits})
    assert buckets.serves_images(entry, hf_config(entry)) is images


def test_a_multimodal_model_served_as_text_plans_its_text_graphs_and_sends_no_image():
    """At zero limits the stack compiles no encoder, merger or step with images: the plan is the multimodal one
    without its multimodal graphs, and no sweep or canary sends an image."""
    text = dataclasses.replace(QWEN3_5, engine={**QWEN3_5.engine, "limit_mm_per_prompt": {"image": 0, "video": 0}})
    config = hf_config(QWEN3_5)
    image_graphs = {g.key for g in buckets.multimodal_graphs(QWEN3_5, config, buckets.paddings(QWEN3_5))}
    assert image_graphs and [g.key for g in plan_entry(text).graphs] == [
        g.key for g in plan_entry(QWEN3_5).graphs if g.key not in image_graphs]
    assert buckets.traffic_images(text, config) == ()


def test_images_with_speculative_decoding_are_refused_naming_the_stack_and_text_is_planned():
    """tpu-inference 0.32 feeds a step with image embeddings to the model without input ids, and its rejection
    sampler asserts them (test_plan_jax.py holds both lines to the stack): the server dies on the first step
    mixing an image prompt with draft tokens (measured on the stock server with Qwen3.5 and MTP). Served as text,
    the same entry plans its drafter."""
    spec = {"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}}
    with_images = dataclasses.replace(QWEN3_5, engine={**QWEN3_5.engine, **spec})
    with pytest.raises(ValueError, match="cannot serve images with speculative decoding"):
        plan_entry(with_images)
    as_text = dataclasses.replace(with_images, engine={**with_images.engine,
                                                       "limit_mm_per_prompt": {"image": 0, "video": 0}})
    assert "drafter_propose" in plan_entry(as_text).families()


@pytest.mark.parametrize("engine, reason", [
    ({"compilation_config": {}}, "jitted per image grid"),
    ({"limit_mm_per_prompt": {"image": 2}}, "not video"),
    ({"compilation_config": {"cudagraph_mm_encoder": True, "encoder_cudagraph_token_budgets": [64, 256]}},
     "as vLLM derives them"),
    ({"mm_processor_kwargs": {"size": {"longest_edge": 512 * 512}}}, "more than the largest encoder budget")])
def test_qwen3_vl_refuses_what_would_compile_per_image_or_the_plan_does_not_follow(engine, reason):
    entry = dataclasses.replace(QWEN3_VL, engine={**QWEN3_VL.engine, **engine})
    with pytest.raises(ValueError, match=reason):
        plan_entry(entry)


@pytest.mark.slow
@pytest.mark.parametrize("entry", EVERY_ENTRY, ids=lambda e: e.name)
def test_multimodal_entry_builds_every_planned_graph_and_only_those(built, entry):
    artifact, report, _ = built[entry.name]
    expected = plan_entry(entry)
    assert report["ok"] and report["planned"] == report["graphs_with_keys"] == len(expected.graphs), report
    manifest = json.loads((artifact / "manifest.json").read_text())
    precompiled = [g for g in manifest["graphs"] if g["family"] in expected.families()]
    assert sorted(GraphSpec.from_dict(g).key for g in precompiled) == sorted(g.key for g in expected.graphs)
    assert all(g["keys"] for g in manifest["graphs"]), "a planned graph left no cache file"


@pytest.mark.slow
@pytest.mark.parametrize("entry, seeds", [(ENTRY, (1, 2)), (DYNAMIC, (1,)), (GEMMA4, (1,)), (LLAMA_GUARD_4, (1,)),
                                           (LLAVA, (1,)), (QWEN3_VL, (1,)), (QWEN3_VL_MOE, (1,)), (QWEN3_5, (1,))],
                         ids=lambda e: getattr(e, "name", ""))
def test_multimodal_entry_verifies_with_zero_misses_under_image_traffic(built, jax_env, announce, entry, seeds):
    """Every planned graph loads from the artifact and a fresh server compiles nothing under text and image
    traffic (two seeds: which images share a batch and where the prefill chunks fall differ)."""
    artifact, _, _ = built[entry.name]
    for seed in seeds:
        proc = run_aotc("verify", artifact, "--traffic", "8", "--seed", str(seed), "--json", env=jax_env, timeout=1800)
        result = json.loads(proc.stdout)
        announce(f"{entry.name} verify (seed {seed}): {result['misses']} misses over {result['traffic_requests']} "
                 f"requests, {result['replayed_graphs']} graphs replayed")
        assert proc.returncode == 0 and result["misses"] == 0 and result["traffic_requests"] > 0, result["missed"]


# Qwen3-VL and its MoE serve images through the same tower, budget manager and serving fixes: the suite's time buys
# the stock server for the MoE (a budget's images, the MoE text model); Qwen3-VL's own canary (two images sharing
# a budget) was measured outside the suite (docs/support.md), its build and verify run above.
CANARY_ENTRIES = [entry for entry in EVERY_ENTRY if entry.model_name not in MULTIMODAL_JAX_WITHOUT_CANARY]


@pytest.mark.slow
@pytest.mark.parametrize("entry", CANARY_ENTRIES, ids=lambda e: e.name)
def test_multimodal_canary_stock_server_compiles_nothing_after_ready(built, jax_env, announce, entry):
    """The stock server, chat requests with images mixed with text under vLLM's load generator: nothing compiles
    at start-up or after ready (AOTC_GUARD=strict would fail a compiling step's requests), every request is
    served, the image requests among them (with dynamic image sizes, eight sizes in four patch buckets, the
    largest beyond the stack's warm-up)."""
    from tests.helpers.canary import canary

    _, _, store = built[entry.name]
    code, doc, err = canary(CONFIG, entry.name, store, jax_env, requests=32)
    announce(f"{entry.name} canary: {doc.get('verdict')}")
    assert code == 0, (doc.get("verdict"), doc.get("problems"), err[-2000:])
    assert doc["compiles_at_startup"] == 0 and doc["compiles_after_ready"] == 0 and doc["failed_requests"] == 0
    assert doc["kinds"]["images"]["ok"] == doc["kinds"]["images"]["sent"] > 0
    # the stack kills its server on prompt logprobs with a multimodal model: left out, and said so
    assert any(line.startswith("prompt_logprobs not requested") for line in doc["limitations"])
