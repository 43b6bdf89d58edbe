"""Runs under the JAX venv (tests/tpu_inference/conftest.py: run_jax): tpu-inference's own CompilationManager.capture_model
over a stand-in runner, recording every `_run_compilation` call instead of compiling it.

The runner's buckets come from its own TPUModelRunner._init_inputs; the loops, the skips (async scheduling, data
parallelism) and the spec-decode steps are capture_model's. Only what a call needs to be *made* is stood in
for (model functions, LoRA and KV-cache plumbing); nothing is lowered or compiled.

stdin: {"cases": [{"seqs", "tokens", "gap", "dp", "spec": null | {"method", "num_speculative_tokens"},
                   "async": bool, "max_model_len": absent (128) | int,
                   "multimodal": absent | {"hf_config": config.json, "additional_config", "mm_processor_kwargs"}},
                  ...]}
A multimodal case runs with the model's own precompile_vision_encoder (Qwen3-VL's: its MMEncoderJITManager's)
on a stand-in model (the encoder functions it hands to `_run_compilation` are never called), and M-RoPE positions
for the Qwen models.
stdout (last line): {"calls": [[[family, shape], ...] per case], "paddings": [{tokens, reqs, logits}...]}
"""

import contextlib
import json
import os
import sys
from types import SimpleNamespace

# as many virtual CPU devices as the widest data-parallel case; read when JAX's CPU client starts
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
os.environ["NUM_PRECOMPILE_WORKERS"] = "1"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from tpu_inference.layers.common.sharding import MESH_AXIS_NAMES_2D  # noqa: E402
from tpu_inference.runner.compilation_manager import CompilationManager, _describe_signature  # noqa: E402
from tpu_inference.runner.tpu_runner import TPUModelRunner  # noqa: E402

from aotc.runners.tpu_inference.instrument import call_signature  # noqa: E402
from aotc.runners.tpu_inference.plan.qwen3_vl import ARCHITECTURES as QWEN3_VL_ARCHITECTURES  # noqa: E402

HIDDEN, VOCAB = 64, 256
MROPE_ARCHITECTURES = ("Qwen2_5_VLForConditionalGeneration", *sorted(QWEN3_VL_ARCHITECTURES))


def recorder(calls):
    def run_compilation(self, name, fn, *args, call_kwargs=None, warmup_handler=None, aot=True,
                        compile_only=False, **kwargs):
        # the stack's logged signature, with aotc's name for an image shape (which the log leaves out)
        family, shape = call_signature(name, kwargs)
        calls.append([family, {**_describe_signature(kwargs), **shape}])

    return run_compilation


def config_namespace(config: dict) -> SimpleNamespace:
    return SimpleNamespace(**{k: config_namespace(v) if isinstance(v, dict) else v for k, v in config.items()})


def architecture(multimodal: dict | None) -> str | None:
    return ((multimodal or {}).get("hf_config", {}).get("architectures") or [None])[0]


def vision_encoder_precompile(multimodal: dict, vllm_config: SimpleNamespace):
    """The model's own precompile_vision_encoder (Qwen2.5-VL's, Gemma 4's or Llama Guard 4's) bound to a stand-in
    model that carries its configs; for LLaVA, vLLM's model on the torchax path, what tpu-inference's
    VllmModelWrapper hands the runner (maybe_precompile_vision_encoder_fn: None, no encoder warm-up)."""
    if architecture(multimodal) == "LlavaForConditionalGeneration":
        from tpu_inference.models.vllm.experimental.vision_tower_jit import maybe_precompile_vision_encoder_fn
        from vllm.model_executor.models.llava import LlavaForConditionalGeneration

        model = LlavaForConditionalGeneration.__new__(LlavaForConditionalGeneration)  # its class is what is read
        return maybe_precompile_vision_encoder_fn(None, lambda *args, **kwargs: None, model, vllm_config)
    if architecture(multimodal) in QWEN3_VL_ARCHITECTURES:
        return qwen3_vl_encoder_precompile(architecture(multimodal), vllm_config)
    if architecture(multimodal) == "Gemma4ForConditionalGeneration":
        from tpu_inference.models.jax.gemma4_mm import Gemma4ForConditionalGeneration

        model = SimpleNamespace(vllm_config=vllm_config)
        return lambda run_compilation: Gemma4ForConditionalGeneration.precompile_vision_encoder(model, run_compilation)
    if architecture(multimodal) == "Llama4ForConditionalGeneration":
        from tpu_inference.models.jax.llama_guard_4 import LlamaGuard4ForCausalLM

        model = SimpleNamespace(vllm_config=vllm_config, _compute_vision_features_jit=None)
        return lambda run_compilation: LlamaGuard4ForCausalLM.precompile_vision_encoder(model, run_compilation)
    from tpu_inference.models.jax.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration

    visual = SimpleNamespace(encode_jit=None, encode_padded_jit=None, enable_dynamic_image_sizes=bool(
        vllm_config.additional_config.get("enable_dynamic_image_sizes", False)))
    model = SimpleNamespace(is_first_rank=True, vllm_config=vllm_config, visual=visual)
    return lambda run_compilation: Qwen2_5_VLForConditionalGeneration.precompile_vision_encoder(model,
                                                                                               run_compilation)


def qwen3_vl_encoder_precompile(architecture_name: str, vllm_config: SimpleNamespace):
    """What tpu-inference's VllmModelWrapper hands the runner for Qwen3-VL (or Qwen3-VL MoE) with
    cudagraph_mm_encoder: its MMEncoderJITManager's precompile_vision_encoder, the budgets derived by vLLM's
    EncoderCudaGraphManager from the compilation config's defaults and the model's own budget range and encoder
    config (the real class's methods, as vLLM's registry resolves the architecture, on a stand-in model whose
    capture inputs are empty: nothing is captured)."""
    import functools

    from tpu_inference.runner.mm_encoder_jit_manager import MMEncoderJITManager
    from vllm.config import CompilationConfig
    from vllm.model_executor.models.registry import ModelRegistry

    model_class = ModelRegistry._try_load_model_cls(architecture_name)

    defaults = CompilationConfig()
    for knob in ("encoder_cudagraph_token_budgets", "encoder_cudagraph_max_vision_items_per_batch",
                 "encoder_cudagraph_max_frames_per_batch"):
        setattr(vllm_config.compilation_config, knob, getattr(defaults, knob))
    hf_config = vllm_config.model_config.hf_config
    vllm_config.model_config.multimodal_config.get_limit_per_prompt = lambda modality: 0  # images only: no video
    vllm_config.model_config.multimodal_config.mm_encoder_tp_mode = "weights"
    model = SimpleNamespace(model_config=vllm_config.model_config, is_multimodal_pruning_enabled=False,
                            visual=SimpleNamespace(out_hidden_size=hf_config.vision_config.out_hidden_size,
                                                   spatial_merge_size=hf_config.vision_config.spatial_merge_size),
                            get_max_frames_per_video=lambda: 1,
                            prepare_encoder_cudagraph_capture_inputs=lambda *args: SimpleNamespace(values={}))
    for method in ("get_encoder_cudagraph_config", "get_encoder_cudagraph_budget_range"):
        setattr(model, method, functools.partial(getattr(model_class, method), model))
    return MMEncoderJITManager(vllm_config, None, model, None).precompile_vision_encoder


def stand_in_runner(case):
    dp, spec, multimodal = case["dp"], case["spec"], case.get("multimodal")
    speculative = None
    if spec:
        # a DFlash draft's config: the target layers it reads (_precompile_dflash_helpers' aux states)
        draft_hf_config = SimpleNamespace(hidden_size=HIDDEN, num_hidden_layers=1,
                                          dflash_config={"target_layer_ids": [0, 1]})
        speculative = SimpleNamespace(num_speculative_tokens=spec["num_speculative_tokens"], method=spec["method"],
                                      draft_model_config=SimpleNamespace(get_hidden_size=lambda: HIDDEN,
                                                                         hf_config=draft_hf_config))
    model_config = SimpleNamespace(max_model_len=case.get("max_model_len", 128), get_sliding_window=lambda: None,
                                   get_vocab_size=lambda: VOCAB,
                                   get_hidden_size=lambda: HIDDEN, uses_mrope=False, dtype="bfloat16",
                                   enforce_eager=False, max_logprobs=20, logprobs_mode="raw_logprobs")
    scheduler_config = SimpleNamespace(max_num_seqs=case["seqs"], max_num_batched_tokens=case["tokens"],
                                       async_scheduling=case["async"])
    vllm_config = SimpleNamespace(
        sharding_config=SimpleNamespace(prefill_cp_size=1, total_dp_size=dp),
        additional_config={}, parallel_config=SimpleNamespace(tensor_parallel_size=1), model_config=model_config,
        scheduler_config=scheduler_config, speculative_config=speculative,
        compilation_config=SimpleNamespace(compilation_time=0.0))
    if multimodal:
        model_config.hf_config = config_namespace(multimodal["hf_config"])
        model_config.multimodal_config = SimpleNamespace(mm_processor_kwargs=multimodal.get("mm_processor_kwargs"))
        vllm_config.additional_config = multimodal.get("additional_config") or {}
    runner = SimpleNamespace(
        model_config=model_config, vllm_config=vllm_config, speculative_config=speculative, dp_size=dp,
        cache_config=SimpleNamespace(block_size=16, cache_dtype="auto"), dtype="bfloat16",
        scheduler_config=scheduler_config,
        mesh=jax.sharding.Mesh(np.array(jax.devices()[:dp]).reshape(dp, 1), MESH_AXIS_NAMES_2D),
        rank=0, uses_mrope=architecture(multimodal) in MROPE_ARCHITECTURES, is_multimodal_model=bool(multimodal), is_last_rank=True, is_first_rank=True, is_pooling_model=False,
        enable_continue_decode=False, lora_config=None, kv_caches=None, state_leaves=None,
        kv_cache_config=SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=["l0"])], has_mamba_layers=False),
        layer_name_to_kvcache_index={}, rng_params_for_sampling=None, model_fn=None, compute_logits_fn=None,
        rejection_sampler=None,
        drafter=SimpleNamespace(propose=None, prepare_inputs=None,
                                block_size=spec["num_speculative_tokens"] + 1 if spec else None),
        input_batch=SimpleNamespace(block_table=[SimpleNamespace(
            get_cpu_tensor=lambda: np.zeros((case["seqs"] * dp, 8), dtype=np.int32))]),
        _substitute_placeholder_token_fn=None, _select_from_array_fn=None, _extract_draft_token_ids=None,
        structured_decoding_manager=SimpleNamespace(structured_decode_fn=None),
        maybe_setup_dummy_loras=lambda *a: contextlib.nullcontext(),
        maybe_select_dummy_loras=lambda *a: contextlib.nullcontext(),
        lora_utils=SimpleNamespace(extract_lora_metadata=lambda: None), embed_input_ids_fn=None,
        precompile_vision_encoder_fn=vision_encoder_precompile(multimodal, vllm_config) if multimodal else None)
    TPUModelRunner._init_inputs(runner)  # the runner's own buckets
    return runner


def captured(case):
    os.environ["VLLM_TPU_BUCKET_PADDING_GAP"] = str(case["gap"])  # tpu_inference.envs reads it on each access
    runner = stand_in_runner(case)
    calls = []
    CompilationManager._run_compilation = recorder(calls)
    CompilationManager(runner).capture_model()
    return calls, {"tokens": runner.num_tokens_paddings, "reqs": runner.num_reqs_paddings,
                   "logits": runner.num_logits_paddings}


results = [captured(case) for case in json.load(sys.stdin)["cases"]]
print(json.dumps({"calls": [c for c, _ in results], "paddings": [p for _, p in results]}))
