"""Runs under the JAX venv (tests/tpu_inference/conftest.py: run_jax): the CPU twin's MoE kernels against references.

stdout (last line): {"gmm_error", "gmm_foreign_rows", "activation_error": {name: float}, "moe_error"}
"""

import json
from types import SimpleNamespace
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from aotc.runners.tpu_inference import twin

twin.install()

from tokamax._src.ops.experimental.gmm_v2 import gmm_v2 as tokamax_gmm  # noqa: E402
from tpu_inference.layers.common.fused_moe_gmm import fused_moe_func  # noqa: E402

from aotc.runners.tpu_inference.twin import moe as twin_moe  # noqa: E402

rng = np.random.default_rng(0)


def normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def gmm_facts() -> tuple[float, float]:
    """A shard holding groups 1..3 of 5 (uneven sizes, one empty), with bias: each row against a plain
    numpy product with its group's weights; rows of other shards' groups must be zero."""
    sizes, offset, local_groups = np.array([4, 10, 0, 12, 6], np.int32), 1, 3
    lhs, rhs, bias = normal(40, 16), normal(local_groups, 16, 8), normal(local_groups, 1, 8)
    got = np.asarray(jax.jit(twin_moe.gmm_v2)(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes),
                                              rhs_bias=jnp.asarray(bias), group_offset=jnp.array([offset])))
    want, foreign = np.zeros_like(got), []
    for row, group in enumerate(np.searchsorted(np.cumsum(sizes), np.arange(40), side="right")):
        if offset <= group < offset + local_groups:
            want[row] = lhs[row] @ rhs[group - offset] + bias[group - offset, 0]
        else:
            foreign.append(row)
    return float(np.abs(got - want).max()), float(np.abs(got[foreign]).max())


def activation_errors() -> dict[str, float]:
    """The twin's split-halves epilogue against tokamax's own apply_act_fn on the lane-interleaved
    accumulator its kernel builds (as tokamax's fused-activation test builds its expected value)."""
    gate, up = jnp.asarray(normal(8, 256) * 4), jnp.asarray(normal(8, 256) * 4)
    errors = {}
    with mock.patch.object(tokamax_gmm.pltpu, "get_tpu_info", lambda: SimpleNamespace(num_lanes=128)):
        for name in ("silu", "gelu", "gelu_tanh", "swigluoai", "silu_and_mul_with_clamp", "situ:4.0:25.0"):
            want = tokamax_gmm.apply_act_fn(tokamax_gmm.interleave_lane(gate, up), name)
            got = twin_moe.fused_activation(jnp.concatenate([gate, up], axis=-1), name)
            errors[name] = float(jnp.abs(got - want).max())
    return errors


def moe_error() -> float:
    """tpu-inference's whole fused_moe_func (GMM, tensor-parallel, on a one-device mesh) through the twin,
    against a dense per-token, per-expert computation: softmax router, top-2 renormalized, SwiGLU experts."""
    tokens, hidden, inter, experts, topk = 32, 64, 256, 8, 2
    x, w1, w2 = normal(tokens, hidden), normal(experts, hidden, 2 * inter) / 8, normal(experts, inter, hidden) / 16
    logits = normal(tokens, experts)
    mesh = twin.cpu_mesh((1, 1), ("data", "model"))
    got = np.asarray(jax.jit(lambda *a: fused_moe_func(
        *a[:3], None, None, None, None, a[3], topk=topk, renormalize=True, mesh=mesh, use_ep=False,
        activation="silu", scoring_fn="softmax"))(x, w1, w2, logits))
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want = np.zeros_like(x)
    for t in range(tokens):
        chosen = np.argsort(-probs[t])[:topk]
        for e in chosen:
            h = x[t] @ w1[e]
            act = h[:inter] / (1 + np.exp(-h[:inter])) * h[inter:]
            want[t] += probs[t, e] / probs[t, chosen].sum() * (act @ w2[e])
    return float(np.abs(got - want).max() / np.abs(want).max())


gmm_error, gmm_foreign_rows = gmm_facts()
print(json.dumps({"gmm_error": gmm_error, "gmm_foreign_rows": gmm_foreign_rows,
                  "activation_error": activation_errors(), "moe_error": moe_error()}))
