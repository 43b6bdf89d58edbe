"""Graphs a stock server reaches that tpu-inference's own warm-up skips, compiled the way its warm-up
compiles their siblings: through `CompilationManager._run_compilation`, with the same function,
shardings and arguments, so the keys are the ones serving looks up. Prompt logprobs above the warm-up's
limit; with speculative decoding, the bonus-token sampler, the rejection sampler with logprobs and the
step's packed host inputs (SPECULATIVE); for a vision-language model, what a step with image embeddings runs
under aotc's serving fixes (MULTIMODAL_STEP).

The plan names them (`GraphSpec.beyond_warmup`, aotc/runners/tpu_inference/plan/buckets.py); this module only
executes what the request's plan lists. Imports JAX: runner-side only.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

PROMPT_LOGPROBS = "gather_prompt_logprobs"
BONUS_SAMPLE = "bonus_sample"
REJECTION_SAMPLER_LOGPROBS = "rejection_sampler_logprobs"
STEP_INPUTS = "unpack_step_inputs"
SPECULATIVE = (BONUS_SAMPLE, REJECTION_SAMPLER_LOGPROBS, STEP_INPUTS)
PROMPT_LOGITS = "prompt_logits"
SELECT_PROMPT_LOGITS = "select_prompt_logits"
PROMPT_LOGITS_F32 = "prompt_logits_f32"
DATA_PARALLEL_STEP = (STEP_INPUTS, PROMPT_LOGITS, SELECT_PROMPT_LOGITS, PROMPT_LOGITS_F32)
VISION_ENCODER_PADDED = "vision_encoder_padded"
IMAGE_ENCODER = "image_encoder"
MULTIMODAL_MASK = "multimodal_mask"
EMPTY_EMBEDDING_ROWS = "empty_embedding_rows"
PLACE_ENCODER_ROWS = "place_encoder_rows"
MULTIMODAL_STEP = (VISION_ENCODER_PADDED, IMAGE_ENCODER, MULTIMODAL_MASK, EMPTY_EMBEDDING_ROWS, PLACE_ENCODER_ROWS)


def prompt_logprobs(manager, token_counts: Iterable[int]) -> None:
    """`_precompile_gather_logprobs`'s prompt-logprob loop for the token paddings above its
    MAX_PRECOMPILE_PROMPT_TOKENS (a server with a larger budget reaches them with `prompt_logprobs`)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec
    from tpu_inference.layers.jax.sample.sampling import compute_and_gather_prompt_logprobs

    runner = manager.runner
    for num_tokens in token_counts:
        logits = jax.ShapeDtypeStruct((num_tokens, runner.vocab_size), jnp.float32, sharding=_logits_sharding(runner))
        token_ids = jax.ShapeDtypeStruct((num_tokens, ), jnp.int32,
                                         sharding=NamedSharding(runner.mesh, PartitionSpec()))
        manager._run_compilation(f"worker{runner.rank} compute_and_gather_prompt_logprobs",
                                 compute_and_gather_prompt_logprobs, logits, token_ids,
                                 runner.model_config.max_logprobs, compile_only=True, num_tokens=num_tokens)


def multimodal_step(manager, shapes: dict[str, list[dict[str, Any]]]) -> None:
    """What a step with image embeddings runs besides the merger (serving_fixes): each image encoder the plan
    lists through the runner's own embed_multimodal_fn (pixels as vLLM hands them over, so its output is the one
    a request's image gets, dtype and sharding alike); per token bucket the placeholder mask lifted to the
    device (gather_mm_embeddings' jnp.array) and the empty buffer; per bucket and encoder output the copy of its
    rows. Through `_run_compilation`, whose warm-up pass runs them in order under the runner's mesh."""
    import jax.numpy as jnp
    import numpy as np

    from aotc.runners.tpu_inference.serving_fixes import step_embeddings

    runner = manager.runner
    images = _images_of(runner)
    sharding = step_embeddings.embedding_sharding(runner.mesh)

    def encoder_output(place_shape: dict[str, Any]):
        return step_embeddings.EncoderRows.of(images.output_of(place_shape)).array

    def empty(rows: int):  # the buffer takes the encoder output's width and dtype (encoded in a call's window)
        any_output = encoder_output(shapes[PLACE_ENCODER_ROWS][0])
        return step_embeddings.empty_embedding_rows(rows, any_output.shape[-1], any_output.dtype, sharding)

    def place(rows: int, place_shape: dict[str, Any]):
        return step_embeddings.place_encoder_rows(empty(rows), encoder_output(place_shape), 0, 0, 1, sharding)

    def mask(rows: int):
        return jnp.array(np.zeros(rows, np.bool_), dtype=jnp.bool_)

    def encode(shape: dict[str, Any]):
        return step_embeddings.EncoderRows.of(images.encoder(shape)).array

    run = functools.partial(manager._run_compilation, warmup_handler=lambda fn, args, kwargs: fn(*args, **kwargs))
    for family in (VISION_ENCODER_PADDED, IMAGE_ENCODER):
        for shape in shapes[family]:
            run(family, encode, shape, **shape)
    for family, fn in ((MULTIMODAL_MASK, mask), (EMPTY_EMBEDDING_ROWS, empty)):
        for shape in shapes[family]:
            run(family, fn, shape["num_tokens"], **shape)
    for shape in shapes[PLACE_ENCODER_ROWS]:
        run(PLACE_ENCODER_ROWS, place, shape["num_tokens"], shape, **shape)


def _images_of(runner):
    """The encoder outputs of the runner's architecture, by the plan's shapes."""
    from aotc.runners import llava
    from aotc.runners.tpu_inference.plan import gemma4_vision, llama_guard_4

    architectures = runner.model_config.hf_config.architectures or []
    if gemma4_vision.ARCHITECTURE in architectures:
        return _Gemma4Images(runner)
    if llama_guard_4.ARCHITECTURE in architectures:
        return _LlamaGuard4Images(runner)
    if llava.ARCHITECTURE in architectures:
        return _LlavaImages(runner)
    return _QwenImages(runner)


class _QwenImages:
    """Qwen2.5-VL's encoder outputs, by the plan's shapes: an image grid's, or the padded encoder's at a patch
    count (an image of exactly that many patches; with dynamic sizes its rows follow the patch bucket)."""

    def __init__(self, runner):
        self.runner, self.vision, self.encoded = runner, runner.model_config.hf_config.vision_config, {}

    def encode_grid(self, grid: str):
        if grid not in self.encoded:
            self.encoded[grid] = _encode_image(self.runner, self.vision, [int(side) for side in grid.split("x")])
        return self.encoded[grid]

    def padded_grid(self, num_patches: int) -> str:
        return f"1x{self.vision.spatial_merge_size}x{num_patches // self.vision.spatial_merge_size}"

    def encoder(self, shape: dict[str, Any]):
        return self.encode_grid(shape.get("image_grid") or self.padded_grid(shape["num_patches"]))

    def output_of(self, place_shape: dict[str, Any]):
        merge = self.vision.spatial_merge_size
        return self.encode_grid(place_shape.get("image_grid") or self.padded_grid(place_shape["encoder_rows"] * merge ** 2))


class _Gemma4Images:
    """Gemma 4's encoder outputs, by soft-token budget: an image's patches padded to budget x pooling**2, as its
    processor hands them over (bfloat16 pixels, int64 positions), and max_soft_tokens rows out."""

    def __init__(self, runner):
        self.runner, self.vision, self.encoded = runner, runner.model_config.hf_config.vision_config, {}

    def encode(self, soft_tokens: int):
        import torch

        if soft_tokens not in self.encoded:
            kernel, patch = self.vision.pooling_kernel_size, self.vision.patch_size
            patches = soft_tokens * kernel ** 2
            # one row of pooled tokens: kernel patches high, soft_tokens x kernel wide
            positions = torch.stack([torch.arange(patches) % (soft_tokens * kernel),
                                     torch.arange(patches) // (soft_tokens * kernel)], dim=-1)
            [rows] = self.runner.embed_multimodal_fn(
                self.runner.state_leaves, modality="image",
                pixel_values=torch.zeros((1, patches, 3 * patch ** 2), dtype=torch.bfloat16),
                pixel_position_ids=positions[None])
            self.encoded[soft_tokens] = rows
        return self.encoded[soft_tokens]

    def encoder(self, shape: dict[str, Any]):
        return self.encode(shape["soft_tokens"])

    def output_of(self, place_shape: dict[str, Any]):
        return self.encode(place_shape["encoder_rows"])


class _LlamaGuard4Images:
    """Llama Guard 4's encoder outputs, by tile count: an image's tiles as its processor hands them over
    (bfloat16 NCHW pixels, the count in patches_per_image), tokens_per_tile rows a tile out."""

    def __init__(self, runner):
        from aotc.runners.tpu_inference.plan.llama_guard_4 import tokens_per_tile

        self.runner, self.vision, self.encoded = runner, runner.model_config.hf_config.vision_config, {}
        self.per_tile = tokens_per_tile(runner.model_config.hf_config.to_dict())

    def encode(self, tiles: int):
        import torch

        if tiles not in self.encoded:
            side = self.vision.image_size
            [rows] = self.runner.embed_multimodal_fn(
                self.runner.state_leaves, modality="image",
                pixel_values=torch.zeros((tiles, self.vision.num_channels, side, side), dtype=torch.bfloat16),
                patches_per_image=torch.tensor([tiles]))
            self.encoded[tiles] = rows
        return self.encoded[tiles]

    def encoder(self, shape: dict[str, Any]):
        return self.encode(shape["image_tiles"])

    def output_of(self, place_shape: dict[str, Any]):
        return self.encode(place_shape["encoder_rows"] // self.per_tile)


class _LlavaImages:
    """LLaVA's one encoder output: an image at the tower's size, as vLLM's processor hands it over (bfloat16
    NCHW pixels), image_tokens rows out."""

    def __init__(self, runner):
        self.runner, self.vision, self.encoded = runner, runner.model_config.hf_config.vision_config, None

    def encoder(self, shape: dict[str, Any] | None = None):
        import torch

        if self.encoded is None:
            side = self.vision.image_size
            [self.encoded] = self.runner.embed_multimodal_fn(
                self.runner.state_leaves, modality="image",
                pixel_values=torch.zeros((1, self.vision.num_channels, side, side), dtype=torch.bfloat16))
        return self.encoded

    output_of = encoder


def _encode_image(runner, vision, grid: list[int]):
    """One image of this patch grid through embed_multimodal_fn, as execute_mm_encoder calls it."""
    import torch

    patches = grid[0] * grid[1] * grid[2]
    row = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    [rows] = runner.embed_multimodal_fn(runner.state_leaves, modality="image",
                                        pixel_values=torch.zeros((patches, row), dtype=runner.model_config.dtype),
                                        image_grid_thw=torch.tensor([grid]))
    return rows


def _sampling_metadata(manager, num_reqs: int, do_sampling: bool, logprobs: bool):
    """TPUSupportedSamplingMetadata as _precompile_sampling builds it (logprobs picks the dummy's shape)."""
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec
    from tpu_inference.layers.common.sharding import ShardingAxisName
    from tpu_inference.layers.jax.sample.sampling_metadata import TPUSupportedSamplingMetadata

    runner = manager.runner
    per_request = NamedSharding(runner.mesh, PartitionSpec(ShardingAxisName.ATTN_DATA))
    knobs = {}
    if do_sampling:
        knobs = {"temperature": manager._create_dummy_tensor((num_reqs, ), jnp.float32, sharding=per_request),
                 "top_k": manager._create_dummy_tensor((num_reqs, ), jnp.int32, sharding=per_request),
                 "top_p": manager._create_dummy_tensor((num_reqs, ), jnp.float32, sharding=per_request)}
    dummy = manager._create_dummy_tensor((1 if logprobs else 2, ), jnp.int32,
                                         sharding=NamedSharding(runner.mesh, PartitionSpec()))
    return TPUSupportedSamplingMetadata(**knobs, _cache_collision_dummy=dummy, do_sampling=do_sampling,
                                        logprobs=logprobs)


def bonus_sample(manager, shapes: Iterable[dict[str, Any]]) -> None:
    """`sample` on the bonus-token rows select_bonus_logits picks: with speculative decoding
    `_sample_from_logits` samples them in the model's dtype, while _precompile_sampling compiles float32 logits
    (the cast of the path without speculation)."""
    from tpu_inference.layers.jax.sample.sampling import sample

    runner = manager.runner
    logits_sharding = _logits_sharding(runner)
    for shape in shapes:
        num_reqs = shape["num_reqs"]
        logits = manager._create_dummy_tensor((num_reqs, runner.vocab_size), runner.model_config.dtype,
                                              sharding=logits_sharding)
        metadata = _sampling_metadata(manager, num_reqs, shape["do_sampling"], shape["logprobs"])
        manager._run_compilation(f"worker{runner.rank} {BONUS_SAMPLE}", sample, runner.rng_params_for_sampling,
                                 runner.mesh, logits, metadata,
                                 call_kwargs={"allow_distributed_sampling": shape["allow_distributed_sampling"]},
                                 **shape)


def rejection_sampler_logprobs(manager, shapes: Iterable[dict[str, Any]]) -> None:
    """_precompile_rejection_sampler's loop with the logprobs dummy (a step whose requests ask for logprobs
    passes the rejection sampler the sampler's metadata; the warm-up compiles logprobs off only), its inputs
    placed as a serving step places them (its compile log's argument mapping): draft tokens and per-request
    counts over the attention data axis, bonus tokens replicated."""
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec
    from tpu_inference.layers.common.sharding import ShardingAxisName

    runner = manager.runner
    probs_sharding = _logits_sharding(runner)
    replicated = NamedSharding(runner.mesh, PartitionSpec())
    per_request = NamedSharding(runner.mesh, PartitionSpec(ShardingAxisName.ATTN_DATA))
    for shape in shapes:
        num_logits, num_reqs = shape["num_logits"], shape["num_reqs"]
        target_probs = manager._create_dummy_tensor((num_logits, runner.vocab_size), runner.model_config.dtype,
                                                    probs_sharding)
        draft_token_ids = manager._create_dummy_tensor((num_logits, ), jnp.int32, sharding=per_request)
        num_draft_tokens = manager._create_dummy_tensor((num_reqs, ), jnp.int32, sharding=per_request)
        bonus_token_ids = manager._create_dummy_tensor((num_reqs, ), jnp.int32, sharding=replicated)
        metadata = _sampling_metadata(manager, num_reqs, shape["do_sampling"], logprobs=True)
        manager._run_compilation(f"worker{runner.rank} {REJECTION_SAMPLER_LOGPROBS}", runner.rejection_sampler,
                                 draft_token_ids, num_draft_tokens, None, target_probs, bonus_token_ids, metadata,
                                 runner.rng_params_for_sampling, **shape)


def step_inputs(manager, shapes: Iterable[dict[str, Any]]) -> None:
    """The eager split of a step's packed host inputs (TPUModelRunner._prepare_inputs: DeviceBuffer, then
    DeviceBuffer.unpack_arrays): one graph per layout, here input ids (the token bucket), query start locations,
    sequence lengths, logits indices (with speculative decoding the logits bucket, which follows the step's
    draft counts) and each KV-cache group's block table. Run as the warm-up runs an unjitted helper."""
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec
    from tpu_inference.layers.common.sharding import ShardingAxisName
    from tpu_inference.utils import DeviceBuffer, device_array

    runner = manager.runner
    groups = max(1, len(runner.kv_cache_config.kv_cache_groups))
    blocks = [runner.input_batch.block_table[g].max_num_blocks_per_req for g in range(groups)]
    sharding = NamedSharding(runner.mesh, PartitionSpec(ShardingAxisName.BATCH))
    for shape in shapes:
        buffer = DeviceBuffer(initial_capacity=1024)
        buffer.get_view((shape["num_tokens"], ), key="input_ids")
        buffer.get_view((runner.attn_max_num_seqs + runner.dp_size, ), key="query_start_loc")
        buffer.get_view((runner.attn_max_num_seqs, ), key="seq_lens")
        buffer.get_view((shape["num_logits"], ), key="logits_indices")
        for group, per_request in enumerate(blocks):
            buffer.get_view((runner.attn_max_num_seqs, per_request), key=f"block_tables_gid_{group}")
        blob, layout = buffer.build()
        distribution = np.zeros(3 * runner.dp_size, dtype=np.int32)
        _, packed = device_array(runner.mesh, (distribution, np.zeros_like(blob)), sharding=sharding)
        manager._run_compilation(f"worker{runner.rank} {STEP_INPUTS}", DeviceBuffer.unpack_arrays, packed, layout,
                                 **shape)


def prompt_logits(manager, shapes: Iterable[dict[str, Any]]) -> None:
    """_precompile_compute_logits' call on a token bucket: with prompt logprobs a step computes logits over
    every token's hidden state."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec
    from tpu_inference.layers.common.sharding import ShardingAxisName

    runner = manager.runner
    sharding = NamedSharding(runner.mesh, PartitionSpec(ShardingAxisName.ATTN_DATA, None))
    for shape in shapes:
        num_tokens = shape["num_tokens"]
        hidden_states = jax.ShapeDtypeStruct((num_tokens, runner.model_config.get_hidden_size()), jnp.bfloat16,
                                             sharding=sharding)
        with runner.maybe_select_dummy_loras(runner.lora_config, np.array([num_tokens], dtype=np.int32)):
            lora_metadata = runner.lora_utils.extract_lora_metadata()
            manager._run_compilation(f"worker{runner.rank} {PROMPT_LOGITS}", runner.compute_logits_fn,
                                     runner.state_leaves, hidden_states, lora_metadata, compile_only=True, **shape)


def select_prompt_logits(manager, shapes: Iterable[dict[str, Any]]) -> None:
    """_precompile_select_from_array_helper's call on vocabulary-wide logits rows: the rows to sample picked
    from the logits over every token, placed as a serving step places them."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec
    from tpu_inference.layers.common.sharding import ShardingAxisName

    runner = manager.runner
    logits_sharding = _logits_sharding(runner)
    index_sharding = NamedSharding(runner.mesh, PartitionSpec(ShardingAxisName.ATTN_DATA))
    for shape in shapes:
        logits = jax.ShapeDtypeStruct((shape["array_size"], runner.vocab_size), jnp.bfloat16, sharding=logits_sharding)
        indices = jax.ShapeDtypeStruct((shape["index_size"], ), jnp.int32, sharding=index_sharding)
        manager._run_compilation(f"worker{runner.rank} {SELECT_PROMPT_LOGITS}", runner._select_from_array_fn, logits,
                                 indices, runner.mesh, runner.vllm_config.sharding_config.prefill_cp_size,
                                 compile_only=True, **shape)


def prompt_logits_f32(manager, shapes: Iterable[dict[str, Any]]) -> None:
    """The eager cast of the logits over every token to float32 before their logprobs are gathered
    (TPUModelRunner._sample_from_logits), on an array placed as serving places it."""
    import jax.numpy as jnp

    runner = manager.runner
    sharding = _logits_sharding(runner)
    for shape in shapes:
        logits = manager._create_dummy_tensor((shape["num_tokens"], runner.vocab_size), jnp.bfloat16, sharding=sharding)
        manager._run_compilation(f"worker{runner.rank} {PROMPT_LOGITS_F32}", _to_float32, logits, **shape)


def _logits_sharding(runner):
    """Where a serving step places vocabulary-wide logits rows (the warm-up's logits sharding)."""
    from jax.sharding import NamedSharding, PartitionSpec
    from tpu_inference.layers.common.sharding import ShardingAxisName

    return NamedSharding(runner.mesh, PartitionSpec(ShardingAxisName.MLP_DATA, ShardingAxisName.MLP_TENSOR))


def _to_float32(logits):
    import jax.numpy as jnp

    return logits.astype(jnp.float32)


def install(plan: Iterable[dict[str, Any]]) -> None:
    """After the stack's own warm-ups, compile the plan's beyond-warm-up graphs: prompt logprobs after its
    logprob warm-up, the speculative ones after its speculative-decoding warm-up, a data-parallel step's after
    its compute_logits warm-up, a step with image embeddings after the input-embeddings merger."""
    from tpu_inference.runner.compilation_manager import CompilationManager

    beyond = [g for g in plan if g.get("beyond_warmup")]
    sizes = [g["shape"]["num_tokens"] for g in beyond if g["family"] == PROMPT_LOGPROBS]
    if sizes:
        _after(CompilationManager, "_precompile_gather_logprobs", lambda manager: prompt_logprobs(manager, sizes))
    shapes = {family: [g["shape"] for g in beyond if g["family"] == family]
              for family in (*SPECULATIVE, *DATA_PARALLEL_STEP)}
    if shapes[BONUS_SAMPLE]:  # speculative decoding: its step-input split follows the logits buckets
        def compile_speculative(manager) -> None:
            bonus_sample(manager, shapes[BONUS_SAMPLE])
            rejection_sampler_logprobs(manager, shapes[REJECTION_SAMPLER_LOGPROBS])
            step_inputs(manager, shapes[STEP_INPUTS])

        _after(CompilationManager, "_precompile_speculative_decoding", compile_speculative)
    elif any(shapes[family] for family in DATA_PARALLEL_STEP):
        def compile_data_parallel_step(manager) -> None:
            step_inputs(manager, shapes[STEP_INPUTS])
            prompt_logits(manager, shapes[PROMPT_LOGITS])
            select_prompt_logits(manager, shapes[SELECT_PROMPT_LOGITS])
            prompt_logits_f32(manager, shapes[PROMPT_LOGITS_F32])

        _after(CompilationManager, "_precompile_compute_logits", compile_data_parallel_step)
    multimodal = {family: [g["shape"] for g in beyond if g["family"] == family] for family in MULTIMODAL_STEP}
    if any(multimodal.values()):
        _after(CompilationManager, "_precompile_input_embeddings_merger",
               lambda manager: multimodal_step(manager, multimodal))


def _after(manager_class, method: str, extra) -> None:
    original = getattr(manager_class, method)

    @functools.wraps(original)
    def then_extra(self) -> None:
        original(self)
        extra(self)

    setattr(manager_class, method, then_extra)
