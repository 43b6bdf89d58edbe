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


def install(plan: Iterable[dict[str, Any]]) -> None:
    """After the stack's own logprob warm-up, compile the plan's beyond-warm-up prompt-logprob graphs."""
    from tpu_inference.runner.compilation_manager import CompilationManager

    sizes = [g["shape"]["num_tokens"] for g in plan if g.get("beyond_warmup") and g["family"] == PROMPT_LOGPROBS]
    if not sizes:
        return
    original = CompilationManager._precompile_gather_logprobs

    @functools.wraps(original)
    def with_beyond_warmup(self) -> None:
        original(self)
        prompt_logprobs(self, sizes)

    CompilationManager._precompile_gather_logprobs = with_beyond_warmup
