"""Graphs a stock server reaches that tpu-inference's own warm-up skips, compiled the way its warm-up
compiles their smaller siblings: through `CompilationManager._run_compilation`, with the same function,
shardings and arguments, so the keys are the ones serving looks up.

The plan names them (`GraphSpec.beyond_warmup`, aotc/runners/tpu_inference/buckets.py); this module only
executes what the request's plan lists. Imports JAX: runner-side only.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

PROMPT_LOGPROBS = "gather_prompt_logprobs"


def prompt_logprobs(manager, token_counts: Iterable[int]) -> None:
    """`_precompile_gather_logprobs`'s prompt-logprob loop for the token paddings above its
    MAX_PRECOMPILE_PROMPT_TOKENS (a server with a larger budget reaches them with `prompt_logprobs`)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec
    from tpu_inference.layers.common.sharding import ShardingAxisName
    from tpu_inference.layers.jax.sample.sampling import compute_and_gather_prompt_logprobs

    runner = manager.runner
    for num_tokens in token_counts:
        logits_sharding = NamedSharding(runner.mesh, PartitionSpec(ShardingAxisName.MLP_DATA,
                                                                   ShardingAxisName.MLP_TENSOR))
        logits = jax.ShapeDtypeStruct((num_tokens, runner.vocab_size), jnp.float32, sharding=logits_sharding)
        token_ids = jax.ShapeDtypeStruct((num_tokens, ), jnp.int32,
                                         sharding=NamedSharding(runner.mesh, PartitionSpec()))
        manager._run_compilation(f"worker{runner.rank} compute_and_gather_prompt_logprobs",
                                 compute_and_gather_prompt_logprobs, logits, token_ids,
                                 runner.model_config.max_logprobs, compile_only=True, num_tokens=num_tokens)


class ImageFeature:
    """What get_mrope_input_positions reads of a request's image (vLLM's MultiModalFeatureSpec.data)."""

    def __init__(self, grid: list[int]):
        self.data = self
        self.grid = grid

    def get_data(self) -> dict[str, Any]:
        import numpy as np

        return {"image_grid_thw": np.array(self.grid)}


def mrope_positions(manager, shapes: list[dict[str, Any]]) -> None:
    """M-RoPE positions as a request's arrival computes them (the model's get_mrope_input_positions, small
    eager JAX ops shaped by the prompt): every text prompt length, and one prompt per image grid (a vision
    start token, the image's tokens, a vision end token), through `_run_compilation` so that its warm-up pass
    runs them under the runner's mesh, as execute_model does."""
    runner = manager.runner
    config = runner.model_config.hf_config
    for shape in shapes:
        if "prompt_len" in shape:
            tokens, features = [0] * shape["prompt_len"], []
        else:
            grid = [int(side) for side in shape["image_grid"].split("x")]
            merged = grid[0] * grid[1] * grid[2] // config.vision_config.spatial_merge_size ** 2
            tokens = [config.vision_start_token_id, *[config.image_token_id] * merged, config.vision_end_token_id]
            features = [ImageFeature(grid)]
        manager._run_compilation("mrope_positions", runner.get_mrope_input_positions_fn, tokens, features,
                                 warmup_handler=lambda fn, args, kwargs: fn(*args, **kwargs)[0], **shape)


def install(plan: Iterable[dict[str, Any]]) -> None:
    """After the stack's own warm-ups, compile the plan's beyond-warm-up graphs: prompt logprobs after its
    logprob warm-up, M-RoPE positions after the backbone over input embeddings (capture_model flushes next)."""
    from tpu_inference.runner.compilation_manager import CompilationManager

    beyond = [g for g in plan if g.get("beyond_warmup")]
    sizes = [g["shape"]["num_tokens"] for g in beyond if g["family"] == PROMPT_LOGPROBS]
    if sizes:
        _after(CompilationManager, "_precompile_gather_logprobs", lambda manager: prompt_logprobs(manager, sizes))
    mrope = [g["shape"] for g in beyond if g["family"] == MROPE_POSITIONS]
    if mrope:
        _after(CompilationManager, "_precompile_backbone_with_inputs_embeds",
               lambda manager: mrope_positions(manager, mrope))


MROPE_POSITIONS = "mrope_positions"


def _after(cls, method: str, then) -> None:
    original = getattr(cls, method)

    @functools.wraps(original)
    def with_beyond_warmup(self) -> None:
        original(self)
        then(self)

    setattr(cls, method, with_beyond_warmup)
