"""tpu-inference's padding rules and precompile loops (vllm-tpu 0.32 / tpu-inference 0.32), as plain data.

Re-implemented, not imported, so that `aotc plan` runs on the core's Python without JAX;
tests/tpu_inference/test_plan_jax.py proves them equal to tpu-inference's own helpers under the JAX venv.
Families are `CompilationManager._precompile_*` steps, named after the jitted function they compile;
a shape is the scalar signature the manager logs for each `_run_compilation` ("Precompile X --> {...}").
Covered: a text-only model; speculative decoding (ngram, eagle3, mtp, dflash: the spec-decode variants and
`_precompile_speculative_decoding`); data parallelism as tpu-inference runs it in one SPMD process
(`total_dp_size`: every request and token bucket scales with it); async scheduling on or off; a vision-language model
tpu-inference runs natively (Qwen2.5-VL: its vision encoder, the input-embeddings merger and the backbone over
input embeddings; Gemma 4: the same without a warm-up encoder, and its encoder per soft-token budget beyond it,
gemma4_vision; Llama Guard 4: its encoder per tile count, llama_guard_4); and LLaVA, vLLM's model on its torchax
path (the input-embeddings merger, and beyond the warm-up its one-size tower, jitted by aotc's serving fixes).
Not covered: prefill context parallelism, disaggregation, continue-decode, multi-process data parallelism.
"""

from __future__ import annotations


from aotc.graphs import GraphSpec
from aotc.entry import Entry
# MIN_NUM_SEQS = runner.utils.MIN_NUM_SEQS; token_paddings and req_paddings equal runner.utils' helpers
from aotc.runners import llava
from aotc.runners.multimodal import image_step_graphs, is_multimodal
from aotc.runners.paddings import MIN_NUM_SEQS, next_power_of_2, req_paddings, token_paddings
from aotc.runners.spec import Planner
from aotc.runners.tpu_inference.plan import gemma4_vision, llama_guard_4, qwen3_vl
from aotc.runners.tpu_inference.plan.block_size import kv_block_size

MIN_TOKEN_BUCKET = 16  # tpu_inference.envs.MIN_TOKEN_BUCKET default
MAX_PRECOMPILE_PROMPT_TOKENS = 1024  # compilation_manager._precompile_gather_logprobs
DTYPE_BITS = {"bfloat16": 16, "float16": 16, "auto": 16, "float32": 32, "fp8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8}

# Plan order = the order the engine compiles them: sampling and logprobs before the KV cache exists
# (TPUWorker.initialize_from_config), then capture_model.
FAMILIES = ("sample", "gather_logprobs", "gather_prompt_logprobs", "backbone", "substitute_placeholder_token",
            "select_from_array", "compute_logits", "structured_decoding")
# Vision-language architectures the plan follows: JAX models (tpu_inference/models/jax), and vLLM's on the torchax path
TORCHAX_MULTIMODAL_ARCHITECTURES = frozenset({llava.ARCHITECTURE}) | qwen3_vl.ARCHITECTURES
PLANNED_MULTIMODAL_ARCHITECTURES = frozenset({"Qwen2_5_VLForConditionalGeneration", gemma4_vision.ARCHITECTURE,
                                              llama_guard_4.ARCHITECTURE}) | TORCHAX_MULTIMODAL_ARCHITECTURES
# vLLM models whose vision tower tpu-inference 0.32 jits with each encoder batch's image grids as a static argument
# (models/vllm/experimental/vision_tower_jit.py: has_jittable_vision, GridTHW) unless cudagraph_mm_encoder runs it
# per token budget (planned for Qwen3-VL and its MoE: qwen3_vl.py); a test derives this set from the stack's own
# predicate over vLLM's registry
GRID_JITTED_VISION_ARCHITECTURES = frozenset({
    "Qwen3OmniMoeForConditionalGeneration", "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Cosmos3ForConditionalGeneration",
    "InternS1ProForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration"})
# Speculative methods vLLM keeps async scheduling on for when the engine leaves it unset (VllmConfig resolves
# async_scheduling=None: EagleModelTypes, with every MTP model type "<model>_mtp", NgramGPUTypes, draft_model,
# dspark, dflash). Any other method (ngram) turns it off. tests/tpu_inference pins this to vLLM's own types.
ASYNC_SPECULATIVE_METHODS = frozenset({"eagle", "eagle3", "extract_hidden_states", "mtp", "dflash", "ngram_gpu",
                                       "draft_model", "dspark"})
# Methods with a drafter whose jitted helpers the plan lists (CompilationManager._precompile_eagle3_helpers,
# _precompile_mtp_helpers and _precompile_dflash_helpers: a proposal and its input preparation per token bucket;
# MTP drafts with the target's own MTP layers, DFlash proposes per token bucket x attention request bucket).
DRAFTER_METHODS = frozenset({"eagle3", "mtp", "dflash"})
PLANNED_SPECULATIVE_METHODS = frozenset({"ngram"}) | DRAFTER_METHODS


def build_token_paddings(min_token_size: int, max_token_size: int, padding_gap: int) -> list[int]:
    """runner.utils.build_token_paddings: the generated buckets capped at the budget, plus the budget."""
    budget = -(-max_token_size // min_token_size) * min_token_size
    generated = token_paddings(min_token_size, max_token_size, padding_gap)
    return sorted({p for p in generated if p <= budget} | {budget})


def attn_req_paddings(max_num_seqs: int) -> list[int]:
    """runner.utils.get_attn_req_paddings with ATTN_BUCKETIZED_NUM_REQS unset: max_num_seqs only."""
    return [max_num_seqs]


def kv_packing(entry: Entry) -> int:
    kv_dtype = entry.engine.get("kv_cache_dtype") or "auto"
    bits = DTYPE_BITS.get(entry.dtype if kv_dtype == "auto" else kv_dtype, 16)
    return 32 // bits


def data_parallel_size(entry: Entry) -> int:
    """ShardingConfigManager's total_dp_size for `--data-parallel-size` in one SPMD process."""
    return int(entry.engine.get("data_parallel_size") or 1)


def max_num_reqs(entry: Entry) -> int:
    """TPUModelRunner.max_num_reqs: every data-parallel rank's max_num_seqs, at least MIN_NUM_SEQS."""
    return max(data_parallel_size(entry) * entry.max_num_seqs, MIN_NUM_SEQS)


def paddings(entry: Entry) -> dict[str, list[int]]:
    """TPUModelRunner's buckets (its __init__); with data parallelism each counts all ranks' requests and tokens."""
    gap = int(entry.env.get("VLLM_TPU_BUCKET_PADDING_GAP", 0))
    dp = data_parallel_size(entry)
    padded = {
        "tokens": build_token_paddings(max(MIN_TOKEN_BUCKET, next_power_of_2(dp * kv_packing(entry))),
                                       entry.max_num_batched_tokens * dp, gap),
        "reqs": req_paddings(max(MIN_NUM_SEQS, next_power_of_2(dp)), max_num_reqs(entry)),
        "attn_reqs": [r * dp for r in attn_req_paddings(entry.max_num_seqs)],
    }
    if spec := speculative_config(entry):
        padded["logits"] = logits_paddings(max_num_reqs(entry), spec["num_speculative_tokens"])
    return padded


def logits_paddings(max_reqs: int, num_speculative_tokens: int) -> list[int]:
    """TPUModelRunner.num_logits_paddings: each request's draft tokens and its bonus token."""
    return token_paddings(MIN_NUM_SEQS, max_reqs * (num_speculative_tokens + 1), 0)


def speculative_config(entry: Entry) -> dict | None:
    """`--speculative-config` as a mapping (the matrix may give it as vllm serve's JSON string)."""
    return entry.engine_mapping("speculative_config") or None


def async_scheduling(entry: Entry) -> bool:
    """SchedulerConfig.async_scheduling as VllmConfig resolves it: the engine's value, else on unless the
    speculative method cannot run with it."""
    explicit = entry.engine.get("async_scheduling")
    if explicit is not None:
        return bool(explicit)
    spec = speculative_config(entry)
    method = (spec or {}).get("method") or ""
    return spec is None or method in ASYNC_SPECULATIVE_METHODS or method.endswith("_mtp")


def capture_plan(entry: Entry, hf_config: dict | None = None) -> list[GraphSpec]:
    """Every `_run_compilation` call tpu-inference makes for this entry, in its order, each shape once."""
    multimodal = serves_images(entry, hf_config)
    p = paddings(entry)
    spec = speculative_config(entry)
    tokens, reqs = p["tokens"], p["reqs"]
    # With speculative decoding the logits rows are every request's draft and bonus positions.
    logits = p["logits"] if spec else reqs
    graphs = [GraphSpec.of("sample", num_reqs=r, do_sampling=s, logprobs=lp, allow_distributed_sampling=True)
              for r in reqs for s in (True, False) for lp in (True, False)]
    graphs += [GraphSpec.of("gather_logprobs", num_reqs=r) for r in reqs]
    if spec:
        graphs += [GraphSpec.of("gather_logprobs_spec", num_logits=n, num_reqs=r) for n, r in _pairs(logits, reqs)]
    # above MAX_PRECOMPILE_PROMPT_TOKENS the stack's warm-up skips them; a server with prompt_logprobs reaches them,
    # except with speculative decoding or a multimodal model, where vLLM rejects prompt logprobs
    graphs += [GraphSpec.of("gather_prompt_logprobs", num_tokens=t, beyond_warmup=t > MAX_PRECOMPILE_PROMPT_TOKENS)
               for t in tokens if t <= MAX_PRECOMPILE_PROMPT_TOKENS or not (spec or multimodal)]
    graphs += [GraphSpec.of("backbone", num_tokens=t, num_reqs=r) for t in tokens for r in p["attn_reqs"]]
    if multimodal:
        graphs += multimodal_graphs(entry, hf_config, p)
    if async_scheduling(entry):  # compilation_manager.capture_model compiles these only then
        graphs += async_scheduling_graphs(entry, p, spec)
    graphs += [GraphSpec.of("select_from_array", array_size=t, index_size=r) for t, r in _pairs(tokens, logits)]
    if spec:
        graphs += [GraphSpec.of("select_bonus_tokens", array_size=n, index_size=r) for n, r in _pairs(logits, reqs)]
        graphs += [GraphSpec.of("select_target_tokens", array_size=n, index_size=n) for n in _not_bonus(logits, reqs)]
    graphs += [GraphSpec.of("compute_logits", num_reqs=r) for r in logits]
    # _precompile_structured_decoding skips dp > 1, and no server reaches it there: tpu-inference's DP scheduler
    # cannot hand a structured-output request to a rank (it pickles the request with its grammar: "cannot
    # pickle '_thread.RLock' object"), so the request fails before any step runs.
    if data_parallel_size(entry) == 1:
        graphs += [GraphSpec.of("structured_decoding", num_reqs=r) for r in reqs]
    if spec:
        graphs += speculative_decoding_graphs(p, spec["method"])
        graphs += speculative_serving_graphs(p, data_parallel_size(entry))
    elif data_parallel_size(entry) > 1:
        graphs += data_parallel_step_graphs(p, prompt_logprobs=not multimodal)
    return list(dict.fromkeys(graphs))  # a loop that repeats a shape (attention request buckets) compiles it once


def serves_images(entry: Entry, hf_config: dict | None) -> bool:
    """A multimodal model the server takes images for. tpu-inference serves one as a text model, compiling no
    multimodal graph, when every modality limit the engine lists is 0 (TPUModelRunner.load_model:
    disable_mm_from_limits; a modality left out counts 999 to vLLM, not to that check)."""
    limits = entry.engine.get("limit_mm_per_prompt") or {}
    text_only = bool(limits) and all(_limit_count(limit) == 0 for limit in limits.values())
    return is_multimodal(hf_config) and not text_only


def _limit_count(limit: int | dict) -> int:
    """A limit_mm_per_prompt value: a count, or vLLM's mapping with one (and a dummy item's size)."""
    return int(limit.get("count", 999) if isinstance(limit, dict) else limit)


def plan_problems(entry: Entry, hf_config: dict | None) -> list[str]:
    """What the plan does not follow, or the stack cannot serve, found while planning: one ``KEY.PATH: reason`` a
    line (rules.validate, RunnerSpec.validate), so capture_plan never meets such an entry."""
    problems = multimodal_problems(entry, hf_config) if serves_images(entry, hf_config) else []
    return problems + speculative_problems(entry) + mesh_problems(entry)


def multimodal_problems(entry: Entry, hf_config: dict) -> list[str]:
    architectures = set(hf_config.get("architectures") or [])
    if not architectures & PLANNED_MULTIMODAL_ARCHITECTURES:
        return [f"model: the tpu-inference plan covers the multimodal architectures "
                f"{', '.join(sorted(PLANNED_MULTIMODAL_ARCHITECTURES))}, not "
                f"{', '.join(sorted(architectures)) or 'this one'}{unplanned_reason(architectures)}"]
    if hf_config.get("audio_config"):
        return ["model: the tpu-inference plan covers image inputs, not a model with an audio tower (audio_config): "
                "not planned yet"]
    impl = str(entry.env.get("MODEL_IMPL_TYPE", "auto")).lower()
    if architectures & TORCHAX_MULTIMODAL_ARCHITECTURES:
        if torchax := torchax_multimodal_problems(hf_config, impl):
            return torchax
    elif impl not in ("auto", "flax_nnx"):
        return [f"env.MODEL_IMPL_TYPE: the tpu-inference plan covers {', '.join(sorted(architectures))} on its JAX "
                "implementation (MODEL_IMPL_TYPE auto or flax_nnx)"]
    if speculative_config(entry):
        return ["engine.speculative_config: tpu-inference 0.32 cannot serve images with speculative decoding: a step "
                "with image embeddings runs the model on them and no input ids, which its rejection sampler needs "
                "(TPUModelRunner._sample_from_logits asserts them; the engine core dies). Serve it as text "
                "(limit_mm_per_prompt 0 for every modality) or without speculative decoding"]
    if entry.engine.get("enable_lora") or data_parallel_size(entry) > 1:
        key = "enable_lora" if entry.engine.get("enable_lora") else "data_parallel_size"
        return [f"engine.{key}: the tpu-inference plan covers multimodal models without LoRA or data parallelism"]
    if gemma4_vision.is_gemma4_vision(hf_config):
        return gemma4_vision.problems(entry)
    if llama_guard_4.is_llama_guard_4(hf_config):
        return llama_guard_4.problems(entry, hf_config)
    if qwen3_vl.is_qwen3_vl(hf_config):
        largest = image_max_patches(entry, hf_config)
        return qwen3_vl.problems(entry, None if largest is None
                                 else largest // hf_config["vision_config"].get("spatial_merge_size", 2) ** 2)
    return []


def unplanned_reason(architectures: set[str]) -> str:
    """Why no plan can list what the stack compiles for an architecture, where that is the stack's own doing."""
    if architectures & GRID_JITTED_VISION_ARCHITECTURES:
        return ("; tpu-inference 0.32 serves it as vLLM's model through torchax and, without cudagraph_mm_encoder, "
                "jits its vision tower with each encoder batch's image grids as a static argument (GridTHW): every new "
                "image size, or mix of sizes in a batch, compiles while serving (its warm-up covers square "
                "power-of-two grids only)")
    return ""


def torchax_multimodal_problems(hf_config: dict, impl: str) -> list[str]:
    """LLaVA, Qwen3-VL and Qwen3-VL MoE run as vLLM's model (tpu-inference has no JAX model for them: auto resolves
    to vllm).
    LLaVA's images are one size (a CLIP or SigLIP tower); a Pixtral tower takes images of any size, which the plan
    does not follow."""
    if impl not in ("auto", "vllm"):
        architecture = ", ".join(sorted(set(hf_config.get("architectures") or []) & TORCHAX_MULTIMODAL_ARCHITECTURES))
        return [f"env.MODEL_IMPL_TYPE: tpu-inference 0.32 has no JAX {architecture}; it serves it as vLLM's model "
                "through torchax (MODEL_IMPL_TYPE auto or vllm)"]
    if hf_config["vision_config"].get("model_type") == "pixtral":
        return ["model: the tpu-inference plan covers LLaVA with a one-size tower (CLIP, SigLIP), not Pixtral's, "
                "whose encoder's shapes follow each image"]
    return []


def additional_config(entry: Entry) -> dict:
    return entry.engine_mapping("additional_config")


def image_shape_label(shape: list[int] | tuple[int, ...]) -> str:
    """A vision warm-up image shape [height, width] as the plan and the build's records name it."""
    return "x".join(str(int(side)) for side in shape)


def vision_encoder_graphs(entry: Entry, hf_config: dict) -> list[GraphSpec]:
    """Qwen2_5_VLForConditionalGeneration.precompile_vision_encoder. With additional_config
    enable_dynamic_image_sizes: the padded encoder at every power-of-two patch count from 16 up to the step's
    patches (max_num_batched_tokens x spatial_merge_size**2, capped by mm_processor_kwargs size.longest_edge
    over patch_size**2). Otherwise: the encoder at each vision_warmup_config.image_shapes entry, [height, width]
    (nothing when none are given: the stack then compiles each image size on its first request)."""
    extra = additional_config(entry)
    if extra.get("enable_dynamic_image_sizes"):
        return [GraphSpec.of("vision_encoder_padded", num_patches=n)
                for n in _padded_patches(16, _warmup_patches(entry, hf_config))]
    shapes = ((extra.get("vision_warmup_config") or {}).get("image_shapes")) or []
    return [GraphSpec.of("vision_encoder", image_shape=image_shape_label(s))
            for s in shapes if isinstance(s, list) and len(s) == 2]


def large_image_encoder_graphs(entry: Entry, hf_config: dict) -> list[GraphSpec]:
    """Beyond the warm-up, with enable_dynamic_image_sizes: the padded encoder at the power-of-two patch counts
    above the warm-up's largest, up to the largest image the processor makes. vLLM encodes an image whole
    whatever the step's budget (its encoder budget is at least one largest image) and feeds its tokens over
    several steps, so an image of more patches than max_num_batched_tokens x merge**2 pads to a count the
    stack's warm-up stopped short of."""
    if not additional_config(entry).get("enable_dynamic_image_sizes"):
        return []
    largest = image_max_patches(entry, hf_config)
    warmup = _padded_patches(16, _warmup_patches(entry, hf_config))
    if largest is None or not warmup:
        return []
    return [GraphSpec.of("vision_encoder_padded", True, num_patches=n)
            for n in _padded_patches(warmup[-1] * 2, largest)]


def _padded_patches(smallest: int, largest: int) -> list[int]:
    """Powers of two from ``smallest`` to the first at or above ``largest`` (the stack's padding)."""
    return [1 << i for i in range(smallest.bit_length() - 1, (largest - 1).bit_length() + 1)]


def _warmup_patches(entry: Entry, hf_config: dict) -> int:
    """The patch count the stack's dynamic-size warm-up pads up to (precompile_vision_encoder's max_patches)."""
    vision = hf_config["vision_config"]
    limit = (((entry.engine.get("mm_processor_kwargs") or {}).get("size") or {}).get("longest_edge"))
    max_patches = entry.max_num_batched_tokens * vision.get("spatial_merge_size", 2) ** 2
    if limit is not None:
        max_patches = int(min(max_patches, float(limit) / vision.get("patch_size", 14) ** 2))
    return max_patches


def image_max_patches(entry: Entry, hf_config: dict) -> int | None:
    """The most patches one image of a prompt can have: the image processor's pixel bound (mm_processor_kwargs'
    size.longest_edge or max_pixels, else the model's preprocessor_config.json's) over patch_size**2, and no
    more than max_model_len tokens hold. None when neither names a bound (a hub model whose
    preprocessor_config.json is not cached)."""
    vision = hf_config["vision_config"]
    pixels = processor_max_pixels(entry)
    if pixels is None:
        return None
    return min(int(pixels) // vision.get("patch_size", 14) ** 2,
               entry.max_model_len * vision.get("spatial_merge_size", 2) ** 2)


def processor_max_pixels(entry: Entry) -> int | None:
    """Qwen2VLImageProcessor's pixel bound: size.longest_edge, or max_pixels, from the engine's
    mm_processor_kwargs (vLLM hands them to the processor), else from the model's preprocessor_config.json."""
    sources = [entry.engine.get("mm_processor_kwargs") or {}, entry.model_json("preprocessor_config.json")]
    for source in sources:
        bound = (source.get("size") or {}).get("longest_edge") or source.get("max_pixels")
        if bound is not None:
            return int(bound)
    return None


# Images a traffic sweep sends when the entry names no warm-up sizes, [height, width].
DEFAULT_IMAGE_SHAPES = ([56, 56], [112, 84])
# With enable_dynamic_image_sizes, sizes in three patch buckets (16, 32, 64 patches), several to a bucket:
# any size is served by its bucket's graphs, so the sweep and the canary show a spread.
DYNAMIC_IMAGE_SHAPES = ([56, 56], [112, 84], [84, 56], [56, 112], [84, 84], [112, 112])
# And where the processor allows images of more patches than a step's budget (large_image_encoder_graphs), these
# too (256 and 168 patches: the 256 bucket), when the bound holds them.
LARGE_IMAGE_SHAPES = ([224, 224], [168, 196])


def traffic_images(entry: Entry, hf_config: dict | None) -> tuple[tuple[int, int, int], ...]:
    """(height, width, prompt tokens) of the images a sweep sends: the vision warm-up's shapes (the sizes the
    stack compiled its encoder for), else DYNAMIC_IMAGE_SHAPES with enable_dynamic_image_sizes, else
    DEFAULT_IMAGE_SHAPES. An image of a multiple of patch_size x
    spatial_merge_size pixels a side keeps its size through the processor, one token per merged patch."""
    if not serves_images(entry, hf_config):
        return ()
    if gemma4_vision.is_gemma4_vision(hf_config):
        return gemma4_vision.traffic_images(entry, hf_config)
    if llama_guard_4.is_llama_guard_4(hf_config):
        return llama_guard_4.traffic_images(entry, hf_config)
    if llava.is_llava(hf_config):
        return llava.traffic_images(hf_config)
    vision = hf_config["vision_config"]
    factor = vision.get("patch_size", 14) * vision.get("spatial_merge_size", 2)
    extra = additional_config(entry)
    shapes = ((extra.get("vision_warmup_config") or {}).get("image_shapes")
              or (DYNAMIC_IMAGE_SHAPES + _large_images(entry, hf_config) if extra.get("enable_dynamic_image_sizes")
                  else DYNAMIC_IMAGE_SHAPES if qwen3_vl.is_qwen3_vl(hf_config)  # any size: its tower runs per budget
                  else DEFAULT_IMAGE_SHAPES))
    sides = [(max(1, round(h / factor)), max(1, round(w / factor))) for h, w in shapes]
    return tuple((h * factor, w * factor, h * w) for h, w in sides)


def _large_images(entry: Entry, hf_config: dict) -> tuple[list[int], ...]:
    """LARGE_IMAGE_SHAPES that reach a padded encoder beyond the warm-up and the processor keeps whole."""
    largest, patch = image_max_patches(entry, hf_config), hf_config["vision_config"].get("patch_size", 14)
    warmup = _warmup_patches(entry, hf_config)
    return tuple(shape for shape in LARGE_IMAGE_SHAPES
                 if largest is not None and warmup < (shape[0] // patch) * (shape[1] // patch) <= largest)


def multimodal_graphs(entry: Entry, hf_config: dict, p: dict[str, list[int]]) -> list[GraphSpec]:
    """capture_model's multimodal steps: the vision encoder; per token bucket the input-embeddings merger with
    and without image embeddings; the backbone over input embeddings at every token bucket (its num_reqs is the
    last attention request bucket: _precompile_backbone_with_inputs_embeds calls the helper after that loop);
    then what a step with images runs beyond the warm-up, per architecture."""
    gemma4, llama_guard = gemma4_vision.is_gemma4_vision(hf_config), llama_guard_4.is_llama_guard_4(hf_config)
    qwen3 = qwen3_vl.is_qwen3_vl(hf_config)
    graphs = ([] if gemma4 or llava.is_llava(hf_config) else llama_guard_4.warmup_graphs(entry) if llama_guard
              else qwen3_vl.warmup_graphs(entry) if qwen3 else vision_encoder_graphs(entry, hf_config))
    for t in p["tokens"]:
        graphs += [GraphSpec.of("input_embeddings_merger", num_tokens=t),
                   GraphSpec.of("input_embeddings_merger_text_only", num_tokens=t)]
    graphs += [GraphSpec.of("backbone_with_embeds", num_tokens=t, num_reqs=p["attn_reqs"][-1]) for t in p["tokens"]]
    if gemma4:
        return graphs + gemma4_vision.step_graphs(entry, hf_config, p["tokens"])
    if llama_guard:
        return graphs + llama_guard_4.step_graphs(entry, hf_config, p["tokens"])
    if llava.is_llava(hf_config):
        return graphs + llava_step_graphs(hf_config, p["tokens"])
    if qwen3:
        return graphs + qwen3_vl.step_graphs(entry, p["tokens"])
    return graphs + multimodal_step_graphs(entry, hf_config, p)


# a package: the fingerprint hashes each of its modules (aotc/fingerprint.py code_digest)
SERVING_FIXES = ("aotc.runners.tpu_inference.serving_fixes",)


def serving_fixes(entry: Entry, hf_config: dict | None) -> tuple[str, ...]:
    """Planner.serving_fixes: they change the graphs of the multimodal architectures the plan follows only;
    a model without a local config (a hub id) may be one, and every machine (an init container too) must
    compute the same fingerprint for it, so it counts as one."""
    if hf_config is None:
        return SERVING_FIXES
    return SERVING_FIXES if set(hf_config.get("architectures") or []) & PLANNED_MULTIMODAL_ARCHITECTURES else ()


def image_grids(entry: Entry, hf_config: dict) -> list[str]:
    """The patch grids (t x h x w) of the images a sweep sends."""
    patch = hf_config["vision_config"].get("patch_size", 14)
    return list(dict.fromkeys(f"1x{h // patch}x{w // patch}" for h, w, _ in traffic_images(entry, hf_config)))


def multimodal_step_graphs(entry: Entry, hf_config: dict, p: dict[str, list[int]]) -> list[GraphSpec]:
    """Beyond the warm-up, what a step with image embeddings runs besides the merger under aotc's serving fixes
    (aotc/runners/tpu_inference/serving_fixes/): per token bucket the step's placeholder mask lifted to the
    device and the empty embedding buffer, per token bucket and encoder output the copy of an image's encoder
    rows into it; and the image encoder per grid when the stack's warm-up compiles none (no vision_warmup_config).
    An encoder output is an image grid's, or with enable_dynamic_image_sizes the padded encoder's, whose rows
    follow the patch bucket, not the image (any image size)."""
    large = large_image_encoder_graphs(entry, hf_config)
    encoders = vision_encoder_graphs(entry, hf_config) + large
    grids = image_grids(entry, hf_config)
    graphs = large if encoders else [GraphSpec.of("image_encoder", True, image_grid=g) for g in grids]
    if additional_config(entry).get("enable_dynamic_image_sizes"):
        unit = hf_config["vision_config"].get("spatial_merge_size", 2) ** 2
        outputs = [{"encoder_rows": g.shape_dict["num_patches"] // unit} for g in encoders]
    else:
        outputs = [{"image_grid": g} for g in grids]
    return graphs + image_step_graphs(p["tokens"], outputs)


def llava_step_graphs(hf_config: dict, tokens: list[int]) -> list[GraphSpec]:
    """Beyond the warm-up (the stack has no LLaVA encoder warm-up on the torchax path): the tower and projector over
    one image, jitted by aotc's serving fixes, at the one size the processor resizes every image to; then the
    image-step families, an image's encoder output being image_tokens rows."""
    side = llava.image_side(hf_config)
    return ([GraphSpec.of("image_encoder", True, image_shape=image_shape_label([side, side]))]
            + image_step_graphs(tokens, [{"encoder_rows": llava.image_tokens(hf_config)}]))


def _pairs(outer: list[int], inner: list[int]) -> list[tuple[int, int]]:
    """CompilationManager._should_skip_padding_combination: an inner size never above the outer one."""
    return [(o, i) for o in outer for i in inner if i <= o]


def _not_bonus(logits: list[int], reqs: list[int]) -> list[int]:
    """Logits buckets whose select-target call compiles a graph of its own: where a request bucket equals the
    logits bucket, the select-bonus call before it already compiled the same function on the same shapes
    (select_from_array over (n, vocab) rows by n indices), and the target call finds it in JAX's memory."""
    return [n for n in logits if n not in reqs]


def speculative_problems(entry: Entry) -> list[str]:
    spec = speculative_config(entry)
    if not spec:
        return []
    method = spec.get("method")
    if method not in PLANNED_SPECULATIVE_METHODS:
        return [f"engine.speculative_config: the tpu-inference plan covers speculative_config.method "
                f"{' or '.join(sorted(PLANNED_SPECULATIVE_METHODS))}, not {method!r}"]
    if not spec.get("num_speculative_tokens"):
        return ["engine.speculative_config: speculative_config needs num_speculative_tokens (its graphs' shapes)"]
    return []


def async_scheduling_graphs(entry: Entry, p: dict[str, list[int]], spec: dict | None) -> list[GraphSpec]:
    """_precompile_substitute_placeholder_token, then with speculative decoding
    _precompile_subtract_num_rejected_tokens and _precompile_concat_last_sampled_tokens_and_draft_tokens."""
    tokens, reqs = p["tokens"], p["reqs"]
    sizes = sorted(set(tokens) | set(reqs))
    if not spec:
        # next tokens the size of the input, or of a request bucket
        return [GraphSpec.of("substitute_placeholder_token", num_tokens=n, next_tokens_size=size)
                for n in sizes for size in dict.fromkeys([n, *reqs])]
    k = spec["num_speculative_tokens"]
    next_size = max_num_reqs(entry) * (k + 1)  # every request's last sampled token and its drafts
    graphs = [GraphSpec.of("substitute_placeholder_token", num_tokens=n, next_tokens_size=next_size)
              for n in [*sizes, *p["logits"]]]
    graphs += [GraphSpec.of("subtract_num_rejected_tokens", num_tokens=t) for t in tokens]
    graphs.append(GraphSpec.of("concat_last_sampled_tokens_and_draft_tokens", max_num_reqs=max_num_reqs(entry),
                               num_spec_tokens=k))
    return graphs


def speculative_decoding_graphs(p: dict[str, list[int]], method: str) -> list[GraphSpec]:
    """CompilationManager._precompile_speculative_decoding, step by step."""
    tokens, reqs, logits = p["tokens"], p["reqs"], p["logits"]
    every = [(n, r) for n in logits for r in reqs]
    graphs = [GraphSpec.of("rejection_sampler", num_logits=n, num_reqs=r, do_sampling=s)
              for n, r in every for s in (False, True)]
    graphs += [GraphSpec.of("extract_last_sampled_tokens", num_logits=n, num_reqs=r) for n, r in every]
    graphs += [GraphSpec.of("extract_draft_token_ids", num_tokens=t, num_logits=n) for t, n in _pairs(tokens, logits)]
    graphs += [GraphSpec.of("process_and_extend_logits", num_logits=n, num_reqs=r) for n, r in _pairs(logits, reqs)]
    graphs += [GraphSpec.of("extend_logits_simple", num_logits=n, num_reqs=r) for n, r in _pairs(logits, reqs)]
    targets = _not_bonus(logits, reqs)
    for n, r in every:
        graphs.append(GraphSpec.of("select_bonus_logits", num_logits=n, num_reqs=r))
        graphs += [GraphSpec.of("select_target_logits", num_logits=n)] if n in targets else []
    if method == "dflash":  # every proposal first, then the input preparations (once per token bucket)
        graphs += [GraphSpec.of("drafter_propose", num_tokens=t, num_reqs=r) for t in tokens for r in p["attn_reqs"]]
        graphs += [GraphSpec.of("drafter_prepare_inputs", num_tokens=t) for t in tokens]
    elif method in DRAFTER_METHODS:  # _precompile_eagle3_helpers / _precompile_mtp_helpers: one of each per token bucket
        for t in tokens:
            graphs += [GraphSpec.of("drafter_propose", num_tokens=t), GraphSpec.of("drafter_prepare_inputs", num_tokens=t)]
    return graphs


def speculative_serving_graphs(p: dict[str, list[int]], dp: int) -> list[GraphSpec]:
    """What a server with speculative decoding runs and the warm-up skips (compiled by the runner,
    aotc/runners/tpu_inference/beyond_warmup.py): the bonus token sampled from model-dtype logits (the warm-up
    samples float32 ones), the rejection sampler with logprobs (warmed with them off), and, in one data-parallel
    rank, the split of each step's packed inputs per token bucket x logits bucket (the logits bucket follows the
    step's draft counts, which no traffic sweep controls)."""
    tokens, reqs, logits = p["tokens"], p["reqs"], p["logits"]
    graphs = [GraphSpec.of("bonus_sample", True, num_reqs=r, do_sampling=s, logprobs=lp, allow_distributed_sampling=True)
              for r in reqs for s in (True, False) for lp in (True, False)]
    graphs += [GraphSpec.of("rejection_sampler_logprobs", True, num_logits=n, num_reqs=r, do_sampling=s)
               for n in logits for r in reqs for s in (False, True)]
    if dp == 1:
        graphs += [GraphSpec.of("unpack_step_inputs", True, num_tokens=t, num_logits=n) for t, n in _pairs(tokens, logits)]
    return graphs


def data_parallel_step_graphs(p: dict[str, list[int]], prompt_logprobs: bool) -> list[GraphSpec]:
    """At data parallel > 1, what a step runs per token bucket x request bucket that the warm-up skips
    (compiled by the runner, aotc/runners/tpu_inference/beyond_warmup.py). At dp 1 the build's traffic sweep
    reaches every pair; at dp > 1 tpu-inference's DP scheduler picks each request's rank, so which pairs a
    step pads to is not the sweep's to choose. The split of the step's packed host inputs, and with prompt
    logprobs (TPUModelRunner._execute_model): logits over every token (compute_logits on a token bucket the
    request buckets do not already compile), the rows picked from them, and their cast to float32."""
    tokens, reqs = p["tokens"], p["reqs"]
    pairs = _pairs(tokens, reqs)
    graphs = [GraphSpec.of("unpack_step_inputs", True, num_tokens=t, num_logits=r) for t, r in pairs]
    if prompt_logprobs:
        graphs += [GraphSpec.of("prompt_logits", True, num_tokens=t) for t in tokens if t not in reqs]
        graphs += [GraphSpec.of("select_prompt_logits", True, array_size=t, index_size=r) for t, r in pairs]
        graphs += [GraphSpec.of("prompt_logits_f32", True, num_tokens=t) for t in tokens]
    return graphs


# The CPU twin's virtual devices (one per tensor-parallel rank): XLA reads this flag when its CPU client starts.
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


# tpu_inference/layers/common/sharding.py MESH_AXIS_NAMES: the new-model mesh's axes, in order.
NEW_MODEL_MESH_AXES = ("data", "attn_dp", "attn_dp_expert", "expert", "model", "dcp", "pcp")


def mesh(entry: Entry) -> dict:
    """TPUModelRunner._init_mesh over the first dp * tp devices; sharding, and so every graph and its key,
    follows it. NEW_MODEL_DESIGN unset: _create_2d_mesh, axes (data, model) = (dp, tp). Set (models whose
    shardings name the expert axis, e.g. Llama 4): _create_new_model_mesh, every axis 1 but model = tp
    (planned for dp 1 only)."""
    dp, tp = data_parallel_size(entry), entry.tensor_parallel_size
    if entry.env.get("NEW_MODEL_DESIGN"):  # dp 1 (mesh_problems)
        return {"axes": {axis: tp if axis == "model" else 1 for axis in NEW_MODEL_MESH_AXES}, "devices": tp}
    return {"axes": {"data": dp, "model": tp}, "devices": dp * tp}


def mesh_problems(entry: Entry) -> list[str]:
    if entry.env.get("NEW_MODEL_DESIGN") and data_parallel_size(entry) > 1:
        return ["env.NEW_MODEL_DESIGN: data parallelism with NEW_MODEL_DESIGN is not planned yet"]
    return []


def implied_flags(entry: Entry) -> dict[str, tuple[str, ...]]:
    """Launch flags the runner adds for this entry (in JAX's cache key): on the twin, a mesh of more than one
    device (tp or dp > 1) needs as many virtual CPU devices. One device adds nothing, so its keys stay those
    of a plain JAX-on-CPU process."""
    devices = mesh(entry)["devices"]
    if entry.device == "cpu" and devices > 1:
        return {"XLA_FLAGS": (f"{DEVICE_COUNT_FLAG}={devices}",)}
    return {}


def bucket_summary(entry: Entry, hf_config: dict | None) -> dict:
    """The buckets, the KV block size and the mesh. The block size depends on the model (an MLA model's
    backend has its own)."""
    p = paddings(entry)
    summary = {"token_paddings": p["tokens"], "request_paddings": p["reqs"], "attention_request_paddings": p["attn_reqs"],
               "block_size": kv_block_size(entry, hf_config), "mesh": mesh(entry)}
    if "logits" in p:
        summary["logits_paddings"] = p["logits"]
    return summary


def implied_env(entry: Entry) -> dict[str, str]:
    """Runner variables this entry sets (RunnerSpec.runner_env): LoRA runs on vLLM's model code.

    tpu-inference 0.32 serves LoRA only through vLLM's model implementation (MODEL_IMPL_TYPE=vllm, run by
    torchax): its own JAX models load no LoRA manager, and a server started with --enable-lora on them
    fails at warm-up ("LoRA is not enabled"). An entry with enable_lora is built and served on that path."""
    return {"MODEL_IMPL_TYPE": "vllm"} if entry.engine.get("enable_lora") else {}


class TpuInferencePlanner(Planner):
    """tpu-inference's plan side (``RunnerSpec.planner``): the rules above, no JAX."""

    capture_plan = staticmethod(capture_plan)
    bucket_summary = staticmethod(bucket_summary)
    implied_flags = staticmethod(implied_flags)
    implied_env = staticmethod(implied_env)
    mesh = staticmethod(mesh)
    traffic_images = staticmethod(traffic_images)
    serving_fixes = staticmethod(serving_fixes)


PLANNER = TpuInferencePlanner()
