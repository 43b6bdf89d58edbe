"""Writes the model zoo's tiny configs: one directory per architecture with config.json and the demo
tokenizer (tiny-llama's), for dummy-weight builds on the CPU twins. No weights, nothing from a hub.

Each config is the architecture's real config.json shape with every size cut down: 2 layers, hidden 64,
the demo's 512-token vocabulary. A vision-language model (VISION_ZOO) adds a 2-block vision tower, the
demo tokenizer with its image special tokens appended, and the image processor's preprocessor_config.json
bounding every image to a few patches (and the processor's processor_config.json where it reads one). A speculative-decoding draft (DRAFTS) is a config.json alone: vLLM
gives a draft the target's tokenizer. Run once after editing ZOO, VISION_ZOO or DRAFTS; the output is
committed.

    python configs/models/make_tiny_models.py
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKENIZER = HERE / "tiny-llama"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

COMMON = {
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
    "max_position_embeddings": 256, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
    "torch_dtype": "bfloat16",
}
# A field's value in ZOO that removes a COMMON key the architecture's config does not have.
OMIT = object()
# MoE sizes: a multiple of 16 tokens x top-k reaches the grouped matmuls of every backend.
MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "norm_topk_prob": True}

GEMMA4_TEXT = {**{k: v for k, v in COMMON.items() if not k.startswith("rope")},
               "model_type": "gemma4_text", "hidden_activation": "gelu_pytorch_tanh",
               "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 32, "global_head_dim": 32,
               "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 512, "final_logit_softcapping": 30.0,
               "tie_word_embeddings": True,
               "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                   "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                      "rope_theta": 1000000.0}}}

DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "head_dim": OMIT,
               "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
               "qk_rope_head_dim": 16, "v_head_dim": 16, "n_routed_experts": 16, "n_shared_experts": 1,
               "num_experts_per_tok": 2, "moe_intermediate_size": 64, "first_k_dense_replace": 1,
               "moe_layer_freq": 1, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
               "norm_topk_prob": True, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "attention_bias": False,
               "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}
# DeepSeek V3's quantization_config: FP8 weights with a scale per 128 x 128 block.
FP8_BLOCKS = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}

ZOO: dict[str, dict] = {
    "tiny-qwen3-moe": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **MOE,
                       "decoder_sparse_step": 1, "mlp_only_layers": [], "attention_bias": False,
                       "output_router_logits": False, "router_aux_loss_coef": 0.001},
    # Qwen3-Next, a hybrid: gated-delta-net linear attention (conv kernel 4, 2 key and 4 value heads of 16) in layer 0,
    # gated full attention with partial RoPE in layer 1 (every 2nd; 4th in the 80B), MoE with a shared expert.
    "tiny-qwen3-next": {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", **MOE,
                        "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1, "mlp_only_layers": [],
                        "full_attention_interval": 2, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
                        "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                        "partial_rotary_factor": 0.25, "attention_bias": False, "output_router_logits": False,
                        "router_aux_loss_coef": 0.001},
    # A shared expert beside the routed ones, and routing weights left unnormalised (norm_topk_prob false).
    "tiny-qwen2-moe": {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", **MOE,
                       "norm_topk_prob": False, "shared_expert_intermediate_size": 128, "decoder_sparse_step": 1,
                       "mlp_only_layers": [], "qkv_bias": True, "output_router_logits": False,
                       "router_aux_loss_coef": 0.001},
    "tiny-mixtral": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 8,
                     "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02, "output_router_logits": False},
    "tiny-qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False},
    # Tied embeddings, as Qwen3 up to 4B: the target tpu-inference's DFlash drafter can share its head with.
    "tiny-qwen3-tied": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
                        "tie_word_embeddings": True},
    "tiny-qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"},
    # tpu-inference's JAX Llama 4 reads the text model from `text_config` (top-1 routed expert plus a shared
    # one, every 4th layer without RoPE); no vision_config: the text-only architecture.
    "tiny-llama4": {"architectures": ["Llama4ForCausalLM"], "model_type": "llama4",
                    "text_config": {**COMMON, "model_type": "llama4_text", "num_local_experts": 8,
                                    "num_experts_per_tok": 1, "intermediate_size": 64, "intermediate_size_mlp": 128,
                                    "interleave_moe_layer_step": 1, "use_qk_norm": True, "attention_chunk_size": 8192,
                                    "no_rope_layers": [], "num_hidden_layers": 4},
                    "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    # GPT-OSS: head_dim 64 (tpu-inference's hd64 attention kernel, with sinks), sliding and full layers
    # alternating, YaRN RoPE, experts with biases and a clamped SwiGLU (swigluoai).
    "tiny-gpt-oss": {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "head_dim": 64,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "experts_per_token": 2, "intermediate_size": 64,
                     "swiglu_limit": 7.0, "sliding_window": 32, "attention_bias": True, "initial_context_length": 64,
                     "layer_types": ["sliding_attention", "full_attention"],
                     "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "truncate": False, "original_max_position_embeddings": 64},
                     "router_aux_loss_coef": 0.9, "output_router_logits": False},
    # An EAGLE-3 target: tpu-inference's JAX Llama hands the drafter the hidden states entering layers
    # (2, n // 2, n - 3) (LlamaModel.get_eagle3_aux_hidden_state_layers), three distinct layers from 8 on.
    # Multi-token prediction: MiMo is Qwen2 with `num_nextn_predict_layers` MTP layers after the backbone, which
    # vLLM serves as its own draft (method: mtp -> MiMoMTPModel). model_type qwen2: transformers knows no "mimo";
    # vLLM picks the MTP draft from the architecture (SpeculativeConfig.hf_config_override).
    "tiny-mimo": {"architectures": ["MiMoForCausalLM"], "model_type": "qwen2", "num_nextn_predict_layers": 1},
    # Gemma 4 text, tpu-inference's own JAX model (it reads `text_config`): sliding and full layers with their
    # own head sizes (global_head_dim), per-layer inputs beside the embeddings, tied embeddings, soft-capped logits.
    "tiny-gemma4": {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4", "text_config": GEMMA4_TEXT,
                    "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
    # DeepSeek V3: multi-head latent attention (low-rank q and kv, a shared rope key), sigmoid-scored grouped
    # routing (4 of 8 groups, as V3: tpu-inference's JAX router has the 4 as a literal) over 16 experts plus a
    # shared one, the first layer dense, YaRN RoPE; block-FP8 weights, as V3 ships (tpu-inference's JAX model
    # loads nothing else). The bf16 twin is for vLLM's model through torchax, whose dummy weights cannot be FP8.
    "tiny-deepseek-v3": {**DEEPSEEK_V3, "quantization_config": FP8_BLOCKS},
    "tiny-deepseek-v3-bf16": DEEPSEEK_V3,
    "tiny-llama-8-layers": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8,
                            "attention_bias": False, "mlp_bias": False},
}

# EAGLE-3 drafts as published: one decoder layer over the target's three hidden states concatenated
# (target_hidden_size), logits over a draft vocabulary mapped into the target's (draft_vocab_size). vLLM names
# the architecture Eagle3<arch> (EAGLEConfig), tpu-inference's Eagle3LlamaForCausalLM.
DRAFTS: dict[str, dict] = {
    # Gemma 4's MTP assistant (vLLM: method mtp, model_type gemma4_assistant -> gemma4_mtp): Gemma 4 text layers
    # without per-layer inputs that read the target's KV cache (every layer KV-shared), over the target's hidden.
    "tiny-gemma4-assistant": {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
                              "text_config": {**GEMMA4_TEXT, "hidden_size_per_layer_input": 0,
                                              "vocab_size_per_layer_input": 0, "num_kv_shared_layers": 2},
                              "backbone_hidden_size": COMMON["hidden_size"], "tie_word_embeddings": True,
                              "torch_dtype": "bfloat16"},
    # DFlash (block diffusion) drafts as z-lab publishes them: Qwen3 layers that denoise a block of mask
    # tokens in one pass, reading the target's hidden states at target_layer_ids; block_size is
    # num_speculative_tokens + 1. tpu-inference's DFlashForCausalLM.
    "tiny-qwen3-dflash": {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": 1,
                          "attention_bias": False, "block_size": 3,
                          "dflash_config": {"mask_token_id": 511, "target_layer_ids": [0, 1]}},
    "tiny-llama-eagle3": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
                          "target_hidden_size": COMMON["hidden_size"], "draft_vocab_size": 256},
}


# Qwen2.5-VL: the image special tokens after the demo's 512 ids; M-RoPE sections split head_dim / 2 = 8.
PATCH, MERGE, TEMPORAL = 14, 2, 2
QWEN3_VL_PATCH = 16
NORMALIZE = {"do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "rescale_factor": 1 / 255,
             "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
# LLaVA 1.5: a CLIP tower over 126x126 pixels (9x9 patches, its class token dropped: 81 image tokens an image,
# whatever the image's size, as 336 pixels give 576), a 2-layer projector, a Llama.
LLAVA_IMAGE = 126


# Gemma 4: a 2-layer vision tower over 16-pixel patches pooled 3 x 3, images at 70 or 140 soft tokens (the
# two smallest budgets its processor takes; 140 by default), the Gemma 4 text model of tiny-gemma4.
GEMMA4_IMAGE = {"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": 140, "patch_size": 16,
                "pooling_kernel_size": 3, "do_convert_rgb": True, "do_normalize": False, "do_rescale": True,
                "do_resize": True, "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0], "resample": 3,
                "rescale_factor": 1 / 255}

# Llama Guard 4 (tpu-inference's LlamaGuard4ForCausalLM for Llama4ForConditionalGeneration): a dense Llama 4 text
# model (no MoE layers; the stack reads its depth from text_config.num_layers, 48 if absent, as the 12B's) and a
# 2-layer Llama 4 vision tower over 56-pixel tiles of 14-pixel patches, pixel-shuffled 2 x 2 (4 tokens a tile);
# an image is cut into at most 4 tiles plus a global one (max_patches), so it takes 1, 3, 4 or 5 tiles.
LLAMA_GUARD_TILE, LLAMA_GUARD_MAX_TILES = 56, 4


@dataclass(frozen=True)
class VisionModel:
    config: dict
    tokens: dict[str, int]  # special tokens appended to the demo tokenizer, at these ids
    preprocessor: dict | None  # preprocessor_config.json: the image processor, where it has a file of its own
    processor: dict | None = None  # processor_config.json, where the model's processor reads one
    named_tokens: dict[str, str] | None = None  # the tokenizer's named special tokens (tokenizer.image_token ...)


# Qwen3-VL: a Qwen3 text model with interleaved M-RoPE, a 2-block tower over 16-pixel patches whose block 0
# also feeds the text model's first layer (deepstack); images of 64 x 64 .. 128 x 128 pixels, 4 .. 16 tokens.
QWEN3_VL = VisionModel(
    config={"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
            "image_token_id": 514, "video_token_id": 515, "vision_start_token_id": 512, "vision_end_token_id": 513,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "text_config": {**COMMON, "model_type": "qwen3_vl_text", "vocab_size": 528, "attention_bias": False,
                            "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                             "mrope_interleaved": True}},
            "vision_config": {"model_type": "qwen3_vl", "depth": 2, "hidden_size": 32, "intermediate_size": 64,
                              "num_heads": 2, "out_hidden_size": 64, "in_channels": 3,
                              "patch_size": QWEN3_VL_PATCH, "spatial_merge_size": MERGE,
                              "temporal_patch_size": TEMPORAL, "num_position_embeddings": 64,
                              "deepstack_visual_indexes": [0], "hidden_act": "gelu_pytorch_tanh"}},
    tokens={"<|vision_start|>": 512, "<|vision_end|>": 513, "<|image_pad|>": 514, "<|video_pad|>": 515},
    preprocessor={"image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor",
                  "size": {"shortest_edge": 64 * 64, "longest_edge": 128 * 128}, "patch_size": QWEN3_VL_PATCH,
                  "merge_size": MERGE, "temporal_patch_size": TEMPORAL, "do_resize": True, **NORMALIZE})

# Qwen3.5: Qwen3-VL's tower without deepstack levels (an empty deepstack_visual_indexes, as Qwen3.5's checkpoints
# ship it: vLLM's model then counts as deepstack with 0 levels, and the stack's Qwen3-VL patches apply) over a hybrid
# text model as Qwen3-Next's (gated-delta-net linear attention in layer 0, gated full attention with partial
# interleaved M-RoPE in layer 1), a dense MLP; and one multi-token-prediction layer, as its checkpoints ship (vLLM
# drafts with it as Qwen3_5MTP under speculative_config method mtp).
QWEN3_5 = dataclasses.replace(QWEN3_VL, config={
    **QWEN3_VL.config, "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
    "text_config": {**COMMON, "model_type": "qwen3_5_text", "vocab_size": 528, "head_dim": 32, "attention_bias": False,
                    "layer_types": ["linear_attention", "full_attention"], "linear_conv_kernel_dim": 4,
                    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,
                    "linear_num_value_heads": 4, "mtp_num_hidden_layers": 1, "rope_theta": OMIT, "rope_scaling": OMIT,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                        "mrope_section": [2, 1, 1], "mrope_interleaved": True}},
    "vision_config": {**QWEN3_VL.config["vision_config"], "model_type": "qwen3_5", "deepstack_visual_indexes": []}})

VISION_ZOO: dict[str, VisionModel] = {
    "tiny-qwen2_5-vl": VisionModel(
        config={"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
                "vocab_size": 528, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
                "vision_start_token_id": 512, "vision_end_token_id": 513, "image_token_id": 514,
                "video_token_id": 515,
                "vision_config": {"depth": 2, "hidden_size": 32,
                                  "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                                  "in_channels": 3, "patch_size": PATCH, "spatial_merge_size": MERGE,
                                  "temporal_patch_size": TEMPORAL, "window_size": 112,
                                  "fullatt_block_indexes": [1], "tokens_per_second": 2,
                                  "hidden_act": "silu"}},
        tokens={"<|vision_start|>": 512, "<|vision_end|>": 513, "<|image_pad|>": 514, "<|video_pad|>": 515},
        # Qwen2VLImageProcessor: every image resized to 56x56 .. 112x112 pixels, i.e. 4 .. 16 patches a side,
        # 4 .. 16 image tokens after the 2x2 merge.
        preprocessor={"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
                      "min_pixels": 56 * 56, "max_pixels": 112 * 112, "patch_size": PATCH, "merge_size": MERGE,
                      "temporal_patch_size": TEMPORAL, "do_resize": True, **NORMALIZE}),
    "tiny-qwen3-vl": QWEN3_VL,
    # Qwen3-VL MoE (as Qwen3-VL-30B-A3B): Qwen3-VL's tower and processor over a Qwen3-MoE text model.
    "tiny-qwen3-vl-moe": dataclasses.replace(QWEN3_VL, config={
        **QWEN3_VL.config, "architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe",
        "text_config": {**QWEN3_VL.config["text_config"], "model_type": "qwen3_vl_moe_text", **MOE,
                        "decoder_sparse_step": 1, "mlp_only_layers": []},
        "vision_config": {**QWEN3_VL.config["vision_config"], "model_type": "qwen3_vl_moe_vision"}}),
    # Cosmos 3 (its reasoner): vLLM's subclass of Qwen3-VL's model, changing only its weight-name mapping, over
    # transformers' Cosmos3OmniConfig (a Qwen3-VL text and vision config)
    "tiny-cosmos3": dataclasses.replace(QWEN3_VL, config={
        **QWEN3_VL.config, "architectures": ["Cosmos3ForConditionalGeneration"], "model_type": "cosmos3_omni"}),
    "tiny-qwen3_5": QWEN3_5,
    # Qwen3.5 MoE (as Qwen3.5-397B-A17B): the same over experts with a shared one
    "tiny-qwen3_5-moe": dataclasses.replace(QWEN3_5, config={
        **QWEN3_5.config, "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "text_config": {**QWEN3_5.config["text_config"], "model_type": "qwen3_5_moe_text", "intermediate_size": OMIT,
                        **{key: MOE[key] for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")},
                        "shared_expert_intermediate_size": 64},
        "vision_config": {**QWEN3_5.config["vision_config"], "model_type": "qwen3_5_moe_vision"}}),
    "tiny-llava": VisionModel(
        config={"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
                "image_token_index": 512, "projector_hidden_act": "gelu", "vision_feature_layer": -2,
                "vision_feature_select_strategy": "default", "tie_word_embeddings": False,
                "text_config": {**COMMON, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                "vocab_size": 528},
                "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                                  "num_attention_heads": 2, "num_hidden_layers": 2, "image_size": LLAVA_IMAGE,
                                  "patch_size": PATCH, "projection_dim": 64, "hidden_act": "quick_gelu"},
                "torch_dtype": "bfloat16"},
        tokens={"<image>": 512},
        preprocessor={"image_processor_type": "CLIPImageProcessor", "processor_class": "LlavaProcessor",
                      "size": {"shortest_edge": LLAVA_IMAGE},
                      "crop_size": {"height": LLAVA_IMAGE, "width": LLAVA_IMAGE}, "do_resize": True,
                      "do_center_crop": True, "resample": 3, **NORMALIZE},
        processor={"processor_class": "LlavaProcessor", "image_token": "<image>", "patch_size": PATCH,
                   "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1}),
    # The image token is named as vLLM's Gemma 4 chat placeholder (get_placeholder_str), so a chat turn with an
    # image reaches the processor through the demo's plain chat template.
    "tiny-gemma4-vision": VisionModel(
        config={"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
                "text_config": {**GEMMA4_TEXT, "vocab_size": 528},
                "vision_config": {"model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 64,
                                  "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
                                  "head_dim": 16, "patch_size": 16, "pooling_kernel_size": 3,
                                  "default_output_length": GEMMA4_IMAGE["max_soft_tokens"],
                                  "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06},
                "boi_token_id": 512, "eoi_token_id": 513, "image_token_id": 514, "video_token_id": 515,
                "audio_token_id": 516, "boa_token_id": 517, "eoa_token_index": 518,
                "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
        tokens={"<|image>": 512, "<image|>": 513, "<image_soft_token>": 514, "<|video|>": 515,
                "<audio_soft_token>": 516, "<|audio>": 517, "<audio|>": 518},
        preprocessor=None,
        processor={"processor_class": "Gemma4Processor", "image_seq_length": GEMMA4_IMAGE["max_soft_tokens"],
                   "image_processor": GEMMA4_IMAGE,
                   "video_processor": {**GEMMA4_IMAGE, "video_processor_type": "Gemma4VideoProcessor",
                                       "image_processor_type": OMIT, "max_soft_tokens": 70, "num_frames": 32},
                   "feature_extractor": {"feature_extractor_type": "Gemma4AudioFeatureExtractor"}},
        # transformers 5.19's Gemma4Processor refuses any input unless the audio tokens are named too
        named_tokens={"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<image_soft_token>",
                      "audio_token": "<audio_soft_token>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}),
    # The image placeholder (<|image|>) is vLLM's Llama 4 chat placeholder; image_token_index is the patch token,
    # the rows the tiles' embeddings go to.
    "tiny-llama-guard-4": VisionModel(
        config={"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                "boi_token_index": 512, "eoi_token_index": 513, "image_token_index": 515,
                "text_config": {**COMMON, "model_type": "llama4_text", "vocab_size": 528, "num_local_experts": 0,
                                "num_experts_per_tok": 0, "interleave_moe_layer_step": 1, "moe_layers": [], "num_layers": 2,
                                "intermediate_size_mlp": 128, "use_qk_norm": True, "attention_chunk_size": 8192,
                                "no_rope_layers": [], "attn_temperature_tuning": True},
                "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 32, "intermediate_size": 128,
                                  "num_hidden_layers": 2, "num_attention_heads": 2, "num_channels": 3,
                                  "image_size": LLAMA_GUARD_TILE, "patch_size": PATCH, "pixel_shuffle_ratio": 0.5,
                                  "projector_input_dim": 64, "projector_output_dim": 64, "vision_output_dim": 64,
                                  "multi_modal_projector_bias": False, "norm_eps": 1e-05, "hidden_act": "gelu",
                                  "rope_theta": 10000, "vision_feature_layer": -1,
                                  "vision_feature_select_strategy": "default"},
                "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
        tokens={"<|image_start|>": 512, "<|image_end|>": 513, "<|image|>": 514, "<|patch|>": 515,
                "<|tile_x_separator|>": 516, "<|tile_y_separator|>": 517},
        preprocessor={"image_processor_type": "Llama4ImageProcessorFast", "processor_class": "Llama4Processor",
                      "size": {"height": LLAMA_GUARD_TILE, "width": LLAMA_GUARD_TILE},
                      "max_patches": LLAMA_GUARD_MAX_TILES, "resize_to_max_canvas": False, "do_resize": True,
                      "resample": 2, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
                      "rescale_factor": 1 / 255, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
        processor={"processor_class": "Llama4Processor", "patch_size": PATCH, "pixel_shuffle_ratio": 0.5}),
}


def write(name: str, fields: dict, tokenizer: bool = True) -> Path:
    out = HERE / name
    out.mkdir(exist_ok=True)
    # A config that nests its text model (text_config) holds the common sizes there only.
    config = fields if "text_config" in fields else {**COMMON, **fields}
    config = _without_omitted(config)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for file in TOKENIZER_FILES if tokenizer else ():
        shutil.copyfile(TOKENIZER / file, out / file)
    return out


def write_vision(name: str, model: VisionModel) -> Path:
    """A vision-language model: its config, the demo tokenizer with the image tokens, the image processor."""
    out = write(name, model.config)
    tokenizer = json.loads((TOKENIZER / "tokenizer.json").read_text())
    tokenizer["added_tokens"] += [{"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                                   "normalized": False, "special": True} for token, i in model.tokens.items()]
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False) + "\n")
    if model.named_tokens:
        tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
        tokenizer_config["extra_special_tokens"] = model.named_tokens
        (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    for file, fields in (("preprocessor_config.json", model.preprocessor), ("processor_config.json", model.processor)):
        if fields is not None:
            (out / file).write_text(json.dumps(_without_omitted(fields), indent=2) + "\n")
    return out


def _without_omitted(fields: dict) -> dict:
    return {key: _without_omitted(value) if isinstance(value, dict) else value
            for key, value in fields.items() if value is not OMIT}


def main() -> None:
    for name, fields in ZOO.items():
        print(write(name, fields))
    for name, fields in DRAFTS.items():
        print(write(name, fields, tokenizer=False))
    for name, model in VISION_ZOO.items():
        print(write_vision(name, model))


if __name__ == "__main__":
    main()
