"""The tpu-inference plan (pure Python, core venv) equals tpu-inference's own helpers (JAX venv)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from aotc.graphs import GraphSpec
from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from aotc.runners.spec import load_runner
from aotc.runners.tpu_inference.plan import buckets, qwen3_vl

from .conftest import REPO, run_jax, run_scripts

BLOCK_SIZE_SCRIPT = Path(__file__).with_name("jax_block_size.py")
MODELS = REPO / "configs" / "models"
UNTIED_QWEN2 = MODELS / "tiny-qwen2"
DFLASH_TARGETS = [[str(MODELS / name), tied] for name in ("tiny-qwen3", "tiny-gemma4", "tiny-llama")
                  for tied in (False, True)]
REAL_FORMATS = ["auto", "safetensors", "runai_streamer"]


DEMO = load_matrix(REPO / "configs" / "demo-jax.yaml", check_stack=False).entries[0]


def sweep() -> list[list[int]]:
    rng = random.Random(7)
    cases = [[DEMO.max_num_seqs, DEMO.max_num_batched_tokens, 0, 2]]  # first: the demo entry's
    cases += [[8, 64, 0, 2], [1, 16, 0, 2], [256, 8192, 0, 2], [128, 512, 64, 2], [64, 1024, 0, 4], [8, 64, 0, 1]]
    cases += [[12, 96, 0, 2], [8, 384, 64, 2], [8, 100, 0, 2], [8, 200, 48, 4], [8, 1000, 128, 1]]
    for i in range(400):
        # powers of two and budgets between buckets, as vLLM accepts them
        tokens = 1 << rng.randint(4, 14) if i % 2 else rng.randint(16, 16384)
        cases.append([rng.randint(1, min(tokens, 1024)), tokens, rng.choice([0, 0, 16, 48, 64, 128, 256, 1000]),
                      rng.choice([1, 2, 4])])
    return cases


# Targets (the stack prefers vLLM's model for the first) and drafts as vLLM names them: Qwen3.5's MTP layers,
# MiMo's, an EAGLE-3 head, a DFlash draft, Gemma 4's assistant
DRAFT_TARGETS = ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "LlamaForCausalLM",
                 "MiMoForCausalLM", "Gemma4ForCausalLM")
DRAFTS = ("Qwen3_5MoeMTP", "Qwen3_5MTP", "MiMoMTP", "Eagle3LlamaForCausalLM", "DFlashDraftModel", "Gemma4MTPModel")


@pytest.fixture(scope="module")
def stack(jax_env) -> dict[str, dict]:
    """The answers of the stack's helper scripts that share one process (jax_scripts.py), by script; jax_facts.py
    first (it reads the launch flags before the stack's import adds to them). Each of these runs alone:
    jax_capture.py (`captured`) sets the CPU device count in XLA_FLAGS before JAX starts, which jax_facts.py reads
    as a launch flag, and replaces CompilationManager._run_compilation; jax_block_size.py and MLA_FACTS build
    engine configs, which load aotc's plugin under the environment they set (a device-cpu entry's
    AOTC_CPU_TWIN=1 installs the twin, which refuses a process that already imported the stack's modules, and
    NEW_MODEL_DESIGN stays set for what follows)."""
    return run_scripts(jax_env, stack_payloads())


def stack_payloads() -> dict[str, dict]:
    """Each script's payload, in the order they run."""
    return {"jax_facts.py": {"paddings": sweep(), "scheduler": scheduler_sweep(),
                             "architectures": [*DRAFT_TARGETS, *DRAFTS]},
            "jax_async_methods.py": {},
            "jax_dummy_weights.py": {"formats": REAL_FORMATS + ["dummy", "jax_dummy"]},
            "jax_dflash_heads.py": {"targets": DFLASH_TARGETS},
            "jax_untied_qwen2.py": {"model": str(UNTIED_QWEN2)},
            "jax_deepseek_v3.py": {"constants": sorted(deepseek_v3_constants()), "v3_config": deepseek_v3_config()}}


@pytest.fixture(scope="module")
def facts(stack):
    return stack["jax_facts.py"]


def test_a_draft_resolves_to_the_implementation_the_rule_says(facts):
    """rules.draft_implementation: the stack's own resolve_model_impl_type under auto, for targets and drafts alike
    (the preferred set is the stack's), and no draft vLLM names resolves to vLLM's model; the stack still refuses a
    draft on another implementation than its target's."""
    from aotc.runners.tpu_inference.plan import rules

    assert rules.VLLM_PREFERRED_ARCHITECTURES == set(facts["vllm_preferred"])
    for architecture, resolved in facts["resolved_implementations"].items():
        expected = rules.resolved_implementation(None, architecture)
        assert resolved["target"] == resolved["draft"] == expected, architecture
    assert {facts["resolved_implementations"][draft]["draft"] for draft in DRAFTS} == {"flax_nnx"}
    assert facts["stack_lines"]["draft_on_target_implementation"]


def test_the_stack_still_serves_a_multimodal_model_as_text_at_zero_limits_and_not_images_with_drafts(facts):
    """buckets.serves_images and the refusal of images with speculative decoding stand on these lines of
    tpu-inference 0.32 (jax_facts.stack_lines)."""
    lines = facts["stack_lines"]
    assert lines["text_only_at_zero_limits"]
    assert lines["image_steps_pass_no_input_ids"] and lines["rejection_needs_input_ids"]


def scheduler_sweep() -> list[list[int]]:
    rng = random.Random(8)
    return [[rng.randint(1, 512), rng.randint(1, 4096), rng.randint(1, 8192), rng.choice((True, False, None))]
            for _ in range(200)]


def test_rules_are_vllm_032s(facts):
    """The tpu-inference runner's rules: vLLM 0.32's SchedulerConfig and tpu-inference's TpuPlatform."""
    from types import SimpleNamespace

    from aotc.runners import vllm_rules
    from aotc.runners.tpu_inference.plan import rules

    assert rules.QUANTIZATIONS == tuple(facts["quantizations"])
    for (seqs, tokens, length, chunked), theirs in zip(scheduler_sweep(), facts["scheduler"]):
        e = SimpleNamespace(max_num_batched_tokens=tokens, max_num_seqs=seqs, max_model_len=length,
                            engine={} if chunked is None else {"enable_chunked_prefill": chunked})
        assert (not vllm_rules.scheduler(e)) == theirs, (seqs, tokens, length, chunked)


def test_plan_accepts_budgets_between_buckets_as_tpu_inference_does(facts):
    """`aotc plan` on 96 and on 384 with gap 64: tpu-inference's own build_token_paddings."""
    cases = sweep()
    for case in ([12, 96, 0, 2], [8, 384, 64, 2]):
        plan = plan_entry(entry_for(*case))
        theirs = facts["paddings"][cases.index(case)]["tokens"]
        assert plan.buckets["token_paddings"] == theirs
        assert sorted({g.shape_dict["num_tokens"] for g in plan.graphs if g.family == "backbone"}) == theirs


def entry_for(seqs: int, tokens: int, gap: int, packing: int):
    dtype = {1: "float32", 2: "bfloat16", 4: "bfloat16"}[packing]
    engine = {"kv_cache_dtype": "fp8"} if packing == 4 else {}
    return type(DEMO)(**{**DEMO.to_dict(), "max_num_seqs": seqs, "max_num_batched_tokens": tokens, "dtype": dtype,
                         "engine": engine, "env": {"VLLM_TPU_BUCKET_PADDING_GAP": gap}})


def test_paddings_equal_tpu_inference_helpers(facts):
    cases = sweep()
    mismatches = [(case, buckets.paddings(entry_for(*case)), theirs)
                  for case, theirs in zip(cases, facts["paddings"]) if buckets.paddings(entry_for(*case)) != theirs]
    assert not mismatches, mismatches[:3]
    assert len(cases) > 400


def test_fingerprint_flags_are_what_tpu_inference_adds(facts):
    for var, added in load_runner("tpu-inference").stack_flags.items():
        assert facts["flags"][var] == list(added), var


def test_cpu_twin_attention_matches_tpu_inference_reference(facts):
    # bf16 outputs: one ulp at |x| ~ 1 is 2**-7.
    assert facts["attention_error"] <= 2 ** -6


def test_cpu_twin_head_dim_64_attention_with_sinks_matches_tpu_inference_reference(facts):
    assert facts["attention_error_hd64"] <= 2 ** -6


def test_cpu_twin_mla_attention_matches_tpu_inference_reference(facts):
    # the outputs, the cache the new tokens were written into, and zero rows past the real tokens; bf16 outputs
    # of up to 4 in size: one ulp there is 2**-6
    assert facts["mla_attention_error"] <= 2 ** -6


def test_demo_plan_follows_tpu_inferences_paddings_through_its_precompile_loops(facts):
    """The demo plan's buckets are tpu-inference's own (computed by its helpers under the JAX venv), and each
    family's count follows from them through the loops of its CompilationManager._precompile_* steps.
    That the plan equals the precompiles tpu-inference really runs is proven by the build itself
    (tests/tpu_inference/test_build_verify_jax.py): the core's plan_coverage fails a build on any missing or unplanned call."""
    padded = facts["paddings"][0]  # sweep()'s first case
    tokens, reqs, attn = padded["tokens"], padded["reqs"], padded["attn_reqs"]
    plan = plan_entry(DEMO)
    assert plan.buckets["token_paddings"] == tokens and plan.buckets["request_paddings"] == reqs
    assert list(plan.families()) == list(buckets.FAMILIES)  # in the order the engine compiles them
    assert plan.families() == {
        "sample": len(reqs) * 2 * 2,  # do_sampling x logprobs
        "gather_logprobs": len(reqs),
        # every token padding: those above the warm-up's limit are planned beyond it (test_beyond_warmup_jax.py)
        "gather_prompt_logprobs": len(tokens),
        "backbone": len(tokens) * len(attn),
        "substitute_placeholder_token": sum(len({n, *reqs}) for n in set(tokens) | set(reqs)),
        "select_from_array": len([(t, r) for t in tokens for r in reqs if r <= t]),
        "compute_logits": len(reqs),
        "structured_decoding": len(reqs),
    }
    assert len({(g.family, g.shape) for g in plan.graphs}) == len(plan.graphs)


CAPTURE = Path(__file__).with_name("jax_capture.py")


def feature_sweep() -> list[dict]:
    """Speculative decoding (ngram, eagle3, mtp, dflash; 1..4 draft tokens), data parallelism 1/2/4, async scheduling as vLLM
    resolves it and explicitly off, over budgets on and between buckets."""
    rng = random.Random(9)
    cases = [{"seqs": 8, "tokens": 64, "gap": 0, "dp": dp, "spec": spec, "async": None}
             for dp in (1, 2) for spec in (None, {"method": "ngram", "num_speculative_tokens": 2},
                                           {"method": "mtp", "num_speculative_tokens": 1},
                                           {"method": "dflash", "num_speculative_tokens": 2})]
    for _ in range(24):
        spec = rng.choice([None, {"method": rng.choice(["ngram", "eagle3", "mtp", "dflash"]),
                                  "num_speculative_tokens": rng.randint(1, 4)}])
        cases.append({"seqs": rng.randint(1, 64), "tokens": rng.choice([64, 100, 256, 512, 1500]),
                      "gap": rng.choice([0, 0, 64]), "dp": rng.choice([1, 2, 4]), "spec": spec,
                      "async": rng.choice([None, False])})
    return cases


def feature_entry(case: dict):
    engine = {"data_parallel_size": case["dp"]}
    if case["spec"]:
        engine["speculative_config"] = case["spec"]
    if case["async"] is not None:
        engine["async_scheduling"] = case["async"]
    base = entry_for(case["seqs"], case["tokens"], case["gap"], 2)
    return type(base)(**{**base.to_dict(), "engine": engine})


@pytest.fixture(scope="module")
def captured(jax_env):
    """capture_model's calls for the feature sweep's cases, then the multimodal sweep's (one JAX process)."""
    cases = [{**c, "async": buckets.async_scheduling(feature_entry(c))} for c in feature_sweep()]
    return run_jax(jax_env, CAPTURE, {"cases": cases + multimodal_capture_cases()})


def test_feature_plans_equal_what_tpu_inferences_capture_model_calls(captured):
    """Speculative decoding, data parallelism and async scheduling: the plan lists exactly the `_run_compilation`
    calls tpu-inference's own capture_model makes (its loops and skips, over buckets from its own
    TPUModelRunner._init_inputs), by family and shape, each once, besides the graphs aotc compiles beyond the
    warm-up; and its buckets are the runner's."""
    for case, calls, theirs in zip(feature_sweep(), captured["calls"], captured["paddings"]):
        entry = feature_entry(case)
        plan = [g.key for g in buckets.capture_plan(entry) if not g.beyond_warmup]  # aotc compiles those itself
        stack = {GraphSpec(family, tuple(shape.items())).key for family, shape in calls}
        assert len(plan) == len(set(plan)), case
        assert set(plan) == stack - repeated_graphs(calls, theirs), (case, sorted(set(plan) ^ stack)[:6])
        ours = buckets.paddings(entry)
        assert (ours["tokens"], ours["reqs"], ours.get("logits")) == (theirs["tokens"], theirs["reqs"],
                                                                      theirs["logits"]), case


def repeated_graphs(calls: list, theirs: dict) -> set[str]:
    """Calls that compile nothing new: a select-target call at a logits bucket that is also a request bucket
    selects (n, vocab) rows by n indices, which the select-bonus call at (n, n) just compiled (a build finds no
    cache entry for it)."""
    twins = {"select_target_tokens": lambda s: s["array_size"], "select_target_logits": lambda s: s["num_logits"]}
    return {GraphSpec(family, tuple(shape.items())).key for family, shape in calls
            if family in twins and twins[family](shape) in theirs["reqs"]}


def test_feature_plans_follow_the_engines_order(captured):
    """Families appear in the order the engine first compiles them (sampling and logprobs first: tpu-inference
    compiles them before the KV cache exists); those aotc compiles beyond the warm-up come after."""
    before_kv_cache = ("sample", "gather_logprobs", "gather_logprobs_spec", "gather_prompt_logprobs")
    for case, calls in zip(feature_sweep(), captured["calls"]):
        first_seen = list(dict.fromkeys(family for family, _ in calls))
        stack = [f for f in before_kv_cache if f in first_seen] + [f for f in first_seen if f not in before_kv_cache]
        ours = [g.family for g in buckets.capture_plan(feature_entry(case)) if not g.beyond_warmup]  # aotc's own
        assert list(dict.fromkeys(ours)) == stack, case


def test_async_scheduling_resolves_as_vllm_does(stack):
    """Unset, vLLM keeps async scheduling on except for a speculative method it cannot run with (ngram): its own
    method types, read under the JAX venv."""
    theirs = stack["jax_async_methods.py"]
    base = entry_for(8, 64, 0, 2)
    for method in theirs["methods"]:
        entry = type(base)(**{**base.to_dict(), "engine": {"speculative_config": {"method": method}}})
        assert buckets.async_scheduling(entry) == (method in theirs["async_methods"]), method
    assert "ngram" in theirs["methods"] and "eagle3" in theirs["async_methods"]


MULTIMODAL = REPO / "configs" / "multimodal-jax.yaml"


def multimodal_sweep() -> list[dict]:
    """Qwen2.5-VL: vision warm-up image shapes (none, some, sizes the encoder rounds), and the padded encoder of
    dynamic image sizes with and without an mm_processor_kwargs size limit, over budgets on and between buckets;
    Gemma 4."""
    shapes = [[], [[56, 56]], [[56, 112], [112, 56], [448, 300]]]
    extras = [{"vision_warmup_config": {"image_shapes": s}} for s in shapes]
    extras += [{"enable_dynamic_image_sizes": True}]
    cases = [{"seqs": seqs, "tokens": tokens, "extra": extra, "mm_kwargs": None}
             for extra in extras for seqs, tokens in ((8, 64), (4, 100), (16, 512))]
    cases += [{"seqs": 8, "tokens": 1024, "extra": {"enable_dynamic_image_sizes": True},
               "mm_kwargs": {"size": {"longest_edge": 112 * 112 * 4}}}]
    # Gemma 4: its warm-up compiles no encoder (the plan's encoder per soft-token budget is beyond it)
    cases += [{"seqs": seqs, "tokens": tokens, "extra": {}, "mm_kwargs": None, "entry": GEMMA4}
              for seqs, tokens in ((8, 128), (4, 100))]
    # Llama Guard 4: its warm-up compiles the tower at one tile for each (tile-sized) warm-up shape, else nothing
    cases += [{"seqs": 8, "tokens": 64, "extra": extra, "mm_kwargs": None, "entry": LLAMA_GUARD_4}
              for extra in ({}, {"vision_warmup_config": {"image_shapes": [[56, 56]]}})]
    # LLaVA through torchax: no encoder warm-up (the stack jits no LLaVA tower), the merger per token bucket
    cases += [{"seqs": 8, "tokens": 64, "extra": {}, "mm_kwargs": None, "entry": LLAVA}]
    # Qwen3-VL through torchax with cudagraph_mm_encoder: the tower per token budget, budgets from one (the
    # smallest, 64) up to powers of two and a last one off them
    cases += [{"seqs": seqs, "tokens": tokens, "extra": {}, "mm_kwargs": None, "entry": QWEN3_VL}
              for seqs, tokens in ((8, 128), (4, 100), (16, 512))]
    # Qwen3-VL MoE: its own class's budget range (one budget at a 64-token step)
    cases += [{"seqs": 8, "tokens": tokens, "extra": {}, "mm_kwargs": None, "entry": QWEN3_VL_MOE}
              for tokens in (64, 256)]
    # Qwen3.5: its own class (a hybrid text model, no deepstack levels)
    cases += [{"seqs": 8, "tokens": 64, "extra": {}, "mm_kwargs": None, "entry": QWEN3_5}]
    return cases


# configs/multimodal-jax.yaml's gemma4-vision, llama-guard-4, llava, qwen3-vl, qwen3-vl-moe and qwen3_5
GEMMA4, LLAMA_GUARD_4, LLAVA, QWEN3_VL, QWEN3_VL_MOE, QWEN3_5 = 2, 3, 4, 5, 6, 7


def multimodal_entry(case: dict):
    base = load_matrix(MULTIMODAL).entries[case.get("entry", 0)]
    engine = {**base.engine, "additional_config": case["extra"]}
    if case["mm_kwargs"]:
        engine["mm_processor_kwargs"] = case["mm_kwargs"]
    return type(base)(**{**base.to_dict(), "max_num_seqs": case["seqs"], "max_num_batched_tokens": case["tokens"],
                         "engine": engine})


def multimodal_capture_cases() -> list[dict]:
    from aotc.entry import hf_config

    cases = []
    for case in multimodal_sweep():
        entry = multimodal_entry(case)
        cases.append({"seqs": case["seqs"], "tokens": case["tokens"], "gap": 0, "dp": 1, "spec": None,
                      "max_model_len": entry.max_model_len,
                      "async": buckets.async_scheduling(entry),
                      "multimodal": {"hf_config": hf_config(entry), "additional_config": case["extra"],
                                     "mm_processor_kwargs": case["mm_kwargs"]}})
    return cases


def test_multimodal_plans_equal_what_tpu_inferences_capture_model_calls(captured):
    """Vision-language models (the tiny Qwen2.5-VL's, Gemma 4's and Llama Guard 4's config.json): the plan's
    warm-up lists exactly the `_run_compilation` calls capture_model makes for a multimodal runner (the text-only
    backbone, the model's own precompile_vision_encoder, the input-embeddings merger and the backbone over input
    embeddings), by family and shape, in the engine's order."""
    from aotc.entry import hf_config

    assert len(captured["calls"]) == len(feature_sweep()) + len(multimodal_sweep())
    for case, calls in zip(multimodal_sweep(), captured["calls"][len(feature_sweep()):]):
        entry = multimodal_entry(case)
        plan = buckets.capture_plan(entry, hf_config(entry))
        planned = [g.key for g in plan if not g.beyond_warmup]
        stack = {GraphSpec(family, tuple(shape.items())).key for family, shape in calls}
        assert len(planned) == len(set(planned)) and set(planned) == stack, (case, sorted(set(planned) ^ stack)[:6])
        before_kv_cache = ("sample", "gather_logprobs", "gather_prompt_logprobs")
        first_seen = list(dict.fromkeys(family for family, _ in calls))
        order = [f for f in before_kv_cache if f in first_seen] + [f for f in first_seen if f not in before_kv_cache]
        assert list(dict.fromkeys(g.family for g in plan if not g.beyond_warmup)) == order, case
        families = {family for family, _ in calls}
        assert {"input_embeddings_merger", "backbone_with_embeds"} <= families, case


def test_plan_refuses_multimodal_architectures_it_does_not_follow():
    from aotc.entry import hf_config

    entry = load_matrix(MULTIMODAL).entries[0]
    config = {**hf_config(entry), "architectures": ["Qwen2VLForConditionalGeneration"]}
    line = refusal(entry, config)
    assert line.startswith("model: the tpu-inference plan covers the multimodal architectures")
    assert "static argument" not in line  # no reason of the stack's is claimed where none is known


def test_qwen3_vl_subclasses_planned_on_its_path_change_none_of_its_methods_but_qwen3_5s_embedding(facts):
    """The architectures planned as Qwen3-VL (qwen3_vl.ARCHITECTURES) are vLLM subclasses of Qwen3-VL's model, which
    the stack's patches take by isinstance. Most define none of its methods anew (the encoder budgets and forward,
    the embedding and merge, the M-RoPE positions): only their text model or weight names differ. Qwen3.5 (dense and
    MoE) defines its embed_input_ids and forward, whose merge is vLLM's own imported into its module (the name the
    fixes swap while their jit traces), and its weight loading. Any other method anew keeps a model refused."""
    overrides = facts["qwen3_vl_overrides"]
    assert qwen3_vl.ARCHITECTURES <= set(overrides)
    for architecture in qwen3_vl.SAME_METHODS_ARCHITECTURES:
        assert overrides[architecture] == [], (architecture, overrides[architecture])
    for architecture in qwen3_vl.OWN_EMBEDDING_ARCHITECTURES:
        assert overrides[architecture] == ["embed_input_ids", "forward", "load_weights"], architecture
        assert facts["merges_with_vllms_own"][architecture], architecture


def test_the_refusal_names_the_stacks_per_grid_tower_where_its_own_predicate_jits_one(facts):
    """The architectures refused for the stack's per-grid vision jit (Qwen3-VL and its kin) are exactly those whose
    model tpu-inference's own has_jittable_vision accepts, over vLLM's registry."""
    from aotc.entry import hf_config

    assert set(facts["grid_jitted_vision"]) == buckets.GRID_JITTED_VISION_ARCHITECTURES
    entry = load_matrix(MULTIMODAL).entries[0]
    for architecture in sorted(buckets.GRID_JITTED_VISION_ARCHITECTURES - qwen3_vl.ARCHITECTURES):
        assert "image grids as a static argument" in refusal(entry, {**hf_config(entry), "architectures": [architecture]})
    # Qwen3-VL itself is planned with the stack's per-budget tower, and refused with the same reason without it
    qwen3 = load_matrix(MULTIMODAL).entries[QWEN3_VL]
    assert buckets.capture_plan(qwen3, hf_config(qwen3)) and refusal(qwen3, hf_config(qwen3)) == ""
    engine = {**qwen3.engine, "compilation_config": {}}
    assert "jitted per image grid" in refusal(type(qwen3)(**{**qwen3.to_dict(), "engine": engine}), hf_config(qwen3))


@pytest.mark.parametrize("impl, tower, reason", [("flax_nnx", "clip_vision_model", "has no JAX"),
                                                 ("auto", "pixtral", "Pixtral")])
def test_plan_refuses_llava_where_the_stack_has_no_model_or_its_images_have_no_one_size(impl, tower, reason):
    from aotc.entry import hf_config

    base = load_matrix(MULTIMODAL).entries[LLAVA]
    entry = type(base)(**{**base.to_dict(), "env": {**base.env, "MODEL_IMPL_TYPE": impl}})
    config = hf_config(entry)
    config = {**config, "vision_config": {**config["vision_config"], "model_type": tower}}
    assert reason in refusal(entry, config)


def refusal(entry, config) -> str:
    """The runner's first refusal of an entry given this config.json ("" for none)."""
    return next(iter(entry.backend.validate(entry, config)), "")


def assert_plan_verdict(tmp_path, jax_env, model_fields: str, refused: bool, *reasons: str) -> None:
    """`aotc plan` on a one-entry matrix at the twin's tiny shapes (``model_fields``: the model's YAML keys before
    its matrix) plans (exit 0) or refuses in one line naming every one of ``reasons`` (exit 2)."""
    from tests.conftest import run_aotc

    config = tmp_path / "m.yaml"
    config.write_text("defaults: {runner: tpu-inference, device: cpu, engine: {num_gpu_blocks_override: 65}}\n"
                      f"models: [{{name: m, {model_fields}, matrix: {{max_model_len: [128], max_num_seqs: [8], "
                      "max_num_batched_tokens: [64]}}]\n")
    plan = run_aotc("plan", config, env=jax_env)
    assert plan.returncode == (2 if refused else 0), (model_fields, plan.stderr)
    if refused:
        assert all(reason in plan.stderr for reason in reasons), plan.stderr
        assert len(plan.stderr.strip().splitlines()) == 1, plan.stderr




def test_untied_jax_qwen2_refusal_is_tpu_inferences_own_breakage(jax_env, stack, tmp_path):
    """tpu-inference 0.32's JAX Qwen2 reads hf_config.text_config for an untied lm_head, which a Qwen2 config
    lacks: an untied Qwen2 on its JAX path is refused at plan (exit 2, one line, naming MODEL_IMPL_TYPE), tied
    or through vLLM's model it plans. When the stack fixes it, the first assertion fails and the rule goes."""
    model = UNTIED_QWEN2
    facts = stack["jax_untied_qwen2.py"]
    assert facts == {"reads_text_config": True, "has_text_config": False, "tied": False}
    for extra, refused in (("", True), (", engine: {hf_overrides: {tie_word_embeddings: true}}", False),
                           (", env: {MODEL_IMPL_TYPE: vllm}", False)):
        assert_plan_verdict(tmp_path, jax_env, f"model: {model}{extra}", refused,
                            "JAX Qwen2ForCausalLM cannot build an untied lm_head", "MODEL_IMPL_TYPE: vllm")


def test_dflash_untied_target_refusal_is_tpu_inferences_own_breakage(jax_env, stack, tmp_path):
    """tpu-inference 0.32's DFlash drafter shares its target's lm_head through a lookup that, on an untied JAX
    Qwen3 or Gemma 4, finds the head module instead of a parameter and dies reading its value. The rule's
    architectures are exactly those where the stack's own lookup finds a module, and only when untied (Llama
    keeps its head as a parameter); a DFlash entry on such a target is refused at plan (exit 2, one line), tied
    it plans. When the stack fixes its lookup, the first assertion fails and the rule goes."""
    from aotc.runners.tpu_inference.plan.rules import JAX_HEAD_MODULE_TIED_BY_DEFAULT

    heads = stack["jax_dflash_heads.py"]["heads"]
    assert {h["architecture"] for h in heads} >= set(JAX_HEAD_MODULE_TIED_BY_DEFAULT)
    for head in heads:
        refused_by_rule = head["architecture"] in JAX_HEAD_MODULE_TIED_BY_DEFAULT and not head["tied"]
        assert head["head_is_module"] == refused_by_rule, head
    dflash = f"speculative_config: {{method: dflash, model: {MODELS / 'tiny-qwen3-dflash'}, num_speculative_tokens: 2}}"
    for target, refused in (("tiny-qwen3", True), ("tiny-qwen3-tied", False)):
        assert_plan_verdict(tmp_path, jax_env, f"model: {MODELS / target}, engine: {{{dflash}}}", refused,
                            "DFlash drafter cannot share the lm_head of an untied JAX Qwen3ForCausalLM")


def test_a_hub_vision_model_plans_from_its_config_in_the_hugging_face_cache(jax_env, tmp_path):
    """Qwen2.5-VL named by hub id, offline: with its config.json in the Hugging Face cache (as `hf download`
    leaves it) the plan is the one its local copy gets, vision families included; without it, the text-only
    plan, said so."""
    import json

    from tests.conftest import run_aotc
    from tests.test_hf_cache import cache_model

    model, commit = "Qwen/Qwen2.5-VL-7B-Instruct", "cc594898137f460bfe9f0759e9844b3ce807cfb5"
    local = REPO / "configs" / "models" / "tiny-qwen2_5-vl"
    body = ("engine: {num_gpu_blocks_override: 64, limit_mm_per_prompt: {image: 2, video: 0}}, "
            "matrix: {max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]}")
    plans = {}
    for name, model_line in (("local", f"model: {local}"), ("hub", f"model: {model}, revision: {commit}")):
        config = tmp_path / f"{name}.yaml"
        config.write_text(f"defaults: {{runner: tpu-inference, device: cpu}}\n"
                          f"models: [{{name: vl, {model_line}, {body}}}]\n")
        plans[name] = config
    env = {**jax_env, "HF_HUB_CACHE": str(tmp_path / "hub")}

    def graphs(config):
        proc = run_aotc("plan", config, "--json", env=env)
        assert proc.returncode == 0, proc.stderr
        entry, = json.loads(proc.stdout)["entries"]
        return entry["model_config"]["source"], entry["graphs"]

    source, expected = graphs(plans["local"])
    assert source == "local" and {"image_encoder", "place_encoder_rows"} <= {g["family"] for g in expected}
    source, text_only = graphs(plans["hub"])
    assert source == "unavailable" and not {g["family"] for g in text_only} & {"image_encoder", "place_encoder_rows"}
    cache_model(tmp_path / "hub", model, commit, local / "config.json")
    assert graphs(plans["hub"]) == ("huggingface-cache", expected)


MLA_FACTS = """
import json, os, sys, types
import vllm.config  # the convertor module and vllm.config import each other: config first, as vLLM does
from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase
cases = json.loads(sys.argv[1])
facts = {"is_mla": {}, "refused": {}}
for model_type, fields in cases["types"]:
    convertor = object.__new__(ModelArchConfigConvertorBase)
    convertor.hf_text_config = types.SimpleNamespace(model_type=model_type, **fields)
    facts["is_mla"][json.dumps([model_type, fields])] = bool(convertor.is_deepseek_mla())
from vllm.engine.arg_utils import EngineArgs
for label, design, extra in cases["settings"]:
    os.environ["NEW_MODEL_DESIGN"] = design
    try:
        EngineArgs(model=cases["model"], load_format="dummy", max_model_len=128, max_num_seqs=8,
                   max_num_batched_tokens=64, num_gpu_blocks_override=65,
                   additional_config=extra).create_engine_config()
        facts["refused"][label] = None
    except Exception as exc:
        facts["refused"][label] = str(exc)
print(json.dumps(facts))
"""


def test_mla_model_settings_are_tpu_inferences_own(jax_env, tmp_path):
    """TpuPlatform refuses an MLA model (DeepSeek V3 here) unless NEW_MODEL_DESIGN=1 and DP attention are both
    set: the plan refuses exactly the settings the stack refuses, one line, exit 2; and the rule's MLA test is
    vLLM's own (is_deepseek_mla) over every model type it names and a few it does not."""
    import json
    import subprocess

    from aotc.runners.tpu_inference.plan import block_size

    model = REPO / "configs" / "models" / "tiny-deepseek-v3"
    dp_attention = {"sharding": {"sharding_strategy": {"enable_dp_attention": True}}}
    settings = [("neither", "0", {}), ("design only", "1", {}), ("dp attention only", "0", dp_attention),
                ("both", "1", dp_attention)]
    types = [(t, {"kv_lora_rank": 32}) for t in sorted(block_size.MLA_MODEL_TYPES)]
    types += [(t, {"kv_lora_rank": None}) for t in ("deepseek_v3", "kimi_k2")]
    types += [(t, {"kv_lora_rank": 32}) for t in ("llama", "qwen3_moe", "deepseek", "gpt_oss")]
    types += [("deepseek_v4", {"compress_ratios": [4], "head_dim": dim}) for dim in (64, None)]
    proc = subprocess.run([jax_env["AOTC_PYTHON_TPU_INFERENCE"], "-c", MLA_FACTS,
                           json.dumps({"types": types, "settings": settings, "model": str(model)})],
                          capture_output=True, text=True, timeout=900, env={**jax_env, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    for model_type, fields in types:
        vllm_says = facts["is_mla"][json.dumps([model_type, fields])]
        assert block_size.uses_mla({"model_type": model_type, **fields}) == vllm_says, model_type
    for label, design, extra in settings:
        stack_refuses = "MLA models require" in (facts["refused"][label] or "")
        assert stack_refuses == (label != "both"), (label, facts["refused"][label])
        assert_plan_verdict(tmp_path, jax_env, f"model: {model}, env: {{NEW_MODEL_DESIGN: {design}, MODEL_IMPL_TYPE: vllm}}, "
                            f"engine: {{additional_config: {json.dumps(extra)}}}", stack_refuses,
                            "refuses an MLA model unless NEW_MODEL_DESIGN: 1")


# (max_model_len, max_num_seqs): around get_page_size's steps and where get_min_page_size passes it
PAGE_CASES = [[length, seqs] for length in (16, 100, 128, 1000, 2048, 4096, 8192, 8193, 16384, 32768, 131072)
              for seqs in (1, 8, 100, 256, 1024, 4096)]
# beside the zoo's: a dense model at many long requests (the SMEM minimum wins), a matrix's own block size, and a
# hybrid whose mamba state (Qwen3-Next 80B's linear-attention sizes) outweighs a 16-token attention block many times
# over: the case upstream vLLM aligns the block size for (Platform._align_hybrid_block_size), which tpu-inference skips
BLOCK_SIZE_MATRIX = """
defaults: {runner: tpu-inference, device: cpu, accelerator: v6e-1, dtype: bfloat16, engine: {num_gpu_blocks_override: 65}}
models:
  - {name: hybrid-big-state, model: MODELS/tiny-qwen3-next,
     engine: {hf_overrides: {linear_num_key_heads: 16, linear_num_value_heads: 32, linear_key_head_dim: 128,
                             linear_value_head_dim: 128}},
     matrix: {max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]}}
  - {name: long, model: MODELS/qwen3-8b, matrix: {max_model_len: [16384], max_num_seqs: [1024],
                                                  max_num_batched_tokens: [1024]}}
  - {name: pinned, model: MODELS/tiny-qwen3, engine: {block_size: 64},
     matrix: {max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]}}
"""


def planned_block_sizes(jax_env, *args: str) -> dict[str, int]:
    import json

    from tests.conftest import run_aotc

    plan = run_aotc("plan", "--json", *args, env=jax_env)
    assert plan.returncode == 0, plan.stderr
    return {e["entry"]: e["buckets"]["block_size"] for e in json.loads(plan.stdout)["entries"]}


def deepseek_v3_constants() -> dict[str, int]:
    """The JAX DeepSeek V3 module constants the rule copies, by name."""
    from aotc.runners.tpu_inference.plan.rules import JAX_DEEPSEEK_V3_CONSTANTS

    return {name: value for name, (_, value) in JAX_DEEPSEEK_V3_CONSTANTS.items() if name is not None}


def deepseek_v3_config() -> list[list]:
    """A V3-sized config: each constant's config key and value."""
    from aotc.runners.tpu_inference.plan.rules import JAX_DEEPSEEK_V3_CONSTANTS

    return [[key, value] for key, value in JAX_DEEPSEEK_V3_CONSTANTS.values()]


def test_plan_reports_the_kv_block_size_tpu_inferences_platform_sets(jax_env, tmp_path):
    """`aotc plan --json`'s block_size is the one in the engine config the stack builds for the entry
    (TpuPlatform.check_and_update_config, then its update_block_size_for_backend, which keeps it for a hybrid
    model): the MLA backend's for the zoo's DeepSeek V3, a dense model's Pallas page size, raised to
    get_min_page_size for many long requests, a matrix's block_size as given; the zoo's Qwen3-Next hybrids, with
    prefix caching (mamba "align" mode), without, and with speculative decoding (which turns it off), and one with
    a large mamba state, the dense model's. The rule equals the backends' own get_page_size / get_min_page_size over a
    sweep."""
    from aotc.runners.tpu_inference.plan import block_size
    from aotc.runners.paddings import page_size

    zoo = REPO / "configs" / "zoo-jax.yaml"
    qwen3_next = ("qwen3-next", "qwen3-next-prefix", "qwen3-next-ngram")
    names = [e.name for e in load_matrix(zoo).entries if e.name.split("--")[0] in ("deepseek-v3", "qwen3", *qwen3_next)]
    matrix = tmp_path / "block-size.yaml"
    matrix.write_text(BLOCK_SIZE_MATRIX.replace("MODELS", str(REPO / "configs" / "models")))
    entries = [e for e in load_matrix(zoo).entries if e.name in names] + list(load_matrix(matrix).entries)
    theirs = run_jax(jax_env, BLOCK_SIZE_SCRIPT, {"entries": [e.to_dict() for e in entries], "pages": PAGE_CASES})
    planned = planned_block_sizes(jax_env, zoo, *(f"--entry={name}" for name in names))
    planned |= planned_block_sizes(jax_env, matrix)
    assert planned == theirs["engine"]
    assert len(set(planned.values())) == 4  # MLA, dense, SMEM-raised and configured sizes all differ
    # every Qwen3-Next entry reaches the engine as a hybrid: prefix on, off, speculative and the large state
    hybrids = {name for name, hybrid in theirs["hybrid"].items() if hybrid}
    assert hybrids == {e.name for e in entries if e.model.endswith("tiny-qwen3-next")}, theirs["hybrid"]
    assert block_size.MLA_PAGE_SIZE == theirs["mla_page"]
    for (length, seqs), (page, minimum) in zip(PAGE_CASES, theirs["pages"]):
        assert (page_size(length), block_size.min_page_size(length, seqs)) == (page, minimum), (length, seqs)




def test_jax_deepseek_v3_rule_is_the_stacks_own_code(jax_env, stack, tmp_path):
    """tpu-inference 0.32's JAX DeepSeek V3 reads DeepSeek V3's sizes from its module constants, routes over a
    literal 4 groups and loads only an FP8 checkpoint: the rule's copy of the constants is the module's, the
    twin reads them from a V3-sized config unchanged (its substitution is a no-op for V3), and the plan refuses
    (exit 2, one line, naming MODEL_IMPL_TYPE: vllm) a bf16 checkpoint, other sizes on a TPU and another group
    top-k anywhere; the tiny FP8 config plans on the twin, and vLLM's model plans the bf16 one. When the stack
    reads its config, the first assertion fails and the rule goes."""
    facts = stack["jax_deepseek_v3.py"]
    assert facts == {"constants": deepseek_v3_constants(), "twin_reads": deepseek_v3_constants(), "topk_groups_literal": True,
                     "asserts_quantization": True}
    models = REPO / "configs" / "models"
    mla = "additional_config: {sharding: {sharding_strategy: {enable_dp_attention: true}}}"
    for fields, refused, reason in (
            (f"model: {models / 'tiny-deepseek-v3-bf16'}", True, "serves only an FP8 checkpoint"),
            (f"model: {models / 'tiny-deepseek-v3'}", False, ""),
            (f"model: {models / 'tiny-deepseek-v3'}, device: tpu, accelerator: v6e-1", True, "hidden_size 64 (not 7168)"),
            (f"model: {models / 'tiny-deepseek-v3'}, engine: {{hf_overrides: {{topk_group: 2}}, {mla}}}", True,
             "topk_group 2 (not 4)"),
            (f"model: {models / 'tiny-deepseek-v3-bf16'}, env: {{NEW_MODEL_DESIGN: 1, MODEL_IMPL_TYPE: vllm}}", False, "")):
        env = "" if "env:" in fields else ", env: {NEW_MODEL_DESIGN: 1}"
        engine = "" if "engine:" in fields else f", engine: {{{mla}}}"
        assert_plan_verdict(tmp_path, jax_env, fields + env + engine, refused, reason, "MODEL_IMPL_TYPE: vllm")


def test_dummy_weight_fix_acts_on_dummy_formats_only(stack):
    """aotc's plugin rewrites the load format tpu-inference's _get_nnx_model sees: "dummy" becomes the stack's
    own "jax_dummy" before an iterator-loaded model is built (its JAX DeepSeek V3 refuses "dummy"), and a
    self-loaded draft after an iterator-loaded target sees "dummy" again (DFlash). Any format a server with real
    weights starts with passes through untouched, inside the call and after it."""
    for case in stack["jax_dummy_weights.py"]["seen"]:
        fmt, iterator, draft = case["format"], case["iterator"], case["draft"]
        if fmt in REAL_FORMATS:
            expected = (fmt, fmt)
        elif fmt == "dummy":
            expected = ("jax_dummy", "jax_dummy") if iterator else ("dummy", "dummy")
        else:  # a target already rewrote the format: a self-loaded draft loads on dummy weights, and only it
            expected = ("dummy", "jax_dummy") if draft and not iterator else ("jax_dummy", "jax_dummy")
        assert (case["inside"], case["after"]) == expected, case
