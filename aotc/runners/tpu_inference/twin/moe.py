"""Jittable pure-JAX stand-ins for the TPU-only kernels of tpu-inference's MoE layer, for the CPU twin.

Both of tpu-inference's model paths (its JAX models and vLLM's PyTorch models through torchax) run MoE
through `fused_moe_func` (tpu_inference/layers/common/fused_moe_gmm.py) with the default GMM backends.
Everything there is plain JAX — routing, top-k, sorting tokens by expert, the shard_map — except:

* `gmm_v2` (tokamax), the Pallas grouped matmul with the gate/up activation fused into its epilogue;
* the SparseCore gathers (`dense_gather_reduce`, `ragged_gather_reduce`, `ragged_gather_v2`), which
  already fall back to plain JAX on a TPU without a SparseCore or for shapes the SparseCore cannot take.

Only those calls are replaced, in the module that calls them, so every array around them keeps the shape
and the graph structure it has on a TPU. The gathers get the kernels' own JAX fallbacks.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from tokamax._src.ops.experimental.gmm_v2 import gmm_v2 as tokamax_gmm


def fused_activation(acc: jax.Array, name: str) -> jax.Array:
    """What `gmm_v2(fuse_act=name)` returns for an f32 product whose first half of columns is the gate
    projection and second half the up projection (tpu-inference's w13 = [w1 | w3] per shard). The kernel
    lane-interleaves the two halves in its accumulator and tokamax's apply_act_fn splits them again."""
    gate, up = jnp.split(acc, 2, axis=-1)
    if name == "silu":
        return jax.nn.silu(gate) * up
    if name in ("gelu", "gelu_tanh"):  # tokamax's "gelu" is jax.nn.gelu's default: the tanh approximation too
        return jax.nn.gelu(gate) * up
    if name == "swigluoai":
        return tokamax_gmm.swigluoai(gate, up)
    if name == "silu_and_mul_with_clamp":
        return tokamax_gmm.silu_and_mul_with_clamp(gate, up)
    if name.startswith("situ:"):
        _, beta, linear_beta = name.split(":")
        return tokamax_gmm.situ_and_mul(gate, up, float(beta), None if linear_beta == "none" else float(linear_beta))
    raise NotImplementedError(f"gmm_v2 fused activation {name!r}")


def _row_groups(num_rows: int, group_sizes: jax.Array, group_offset: jax.Array, num_local_groups: int):
    """Each lhs row's local group (rows are sorted by group) and whether this shard holds that group."""
    ends = jnp.cumsum(group_sizes)
    row = jnp.arange(num_rows, dtype=ends.dtype)
    local = jnp.searchsorted(ends, row, side="right").astype(jnp.int32) - group_offset
    mine = (local >= 0) & (local < num_local_groups) & (row < ends[-1])
    return jnp.clip(local, 0, num_local_groups - 1), mine


def _dequantized(rhs: jax.Array, rhs_scale: jax.Array | None) -> jax.Array:
    """[groups, k, n] in f32, each block of k rows times its scale ([groups, blocks, 1, n])."""
    if rhs_scale is None:
        return rhs
    groups, k, n = rhs.shape
    blocks = rhs_scale.shape[1]
    scaled = rhs.astype(jnp.float32).reshape(groups, blocks, k // blocks, n) * rhs_scale.astype(jnp.float32)
    return scaled.reshape(groups, k, n)


def gmm_v2(
    lhs: jax.Array,  # [m, k], rows sorted by group
    rhs: jax.Array,  # [local groups, k, n] ([.., n, k] if transpose_rhs)
    group_sizes: jax.Array,  # i32[global groups]
    rhs_scale: jax.Array | None = None,  # [local groups, blocks, 1, n]
    rhs_bias: jax.Array | None = None,  # [local groups, 1, n]
    group_offset: jax.Array | None = None,  # i32[1]: this shard's first group
    lhs_scale: jax.Array | None = None,
    *,
    preferred_element_type: Any = None,
    fuse_act: str | None = None,
    transpose_rhs: bool = False,
    **_tuning: Any,  # tiling, vmem limit, zero_initialize, lhs quantization: TPU-kernel choices
) -> jax.Array:
    """tokamax's gmm_v2: row i of `lhs` times the weights of its group, in f32, then bias and activation.

    Rows of groups another shard holds (and rows past the last group) are zero; the kernel leaves them
    unwritten with zero_initialize=False, and every caller masks them out.
    """
    del lhs_scale  # only meaningful with the kernel's in-kernel lhs quantization
    if transpose_rhs:
        rhs = jnp.swapaxes(rhs, 1, 2)
    offset = jnp.zeros((), jnp.int32) if group_offset is None else jnp.asarray(group_offset).reshape(-1)[0]
    local, mine = _row_groups(lhs.shape[0], group_sizes, offset, rhs.shape[0])
    # ragged_dot wants this shard's groups from row 0: rotate the rows of earlier groups to the end.
    first_row = jnp.sum(jnp.where(jnp.arange(group_sizes.shape[0]) < offset, group_sizes, 0)).astype(jnp.int32)
    local_sizes = jax.lax.dynamic_slice_in_dim(group_sizes, offset, rhs.shape[0]).astype(jnp.int32)
    weights = _dequantized(rhs, rhs_scale)
    acc = jax.lax.ragged_dot(jnp.roll(lhs, -first_row, axis=0).astype(weights.dtype), weights, local_sizes,
                             preferred_element_type=jnp.float32)
    acc = jnp.roll(acc, first_row, axis=0)
    if rhs_bias is not None:
        acc = acc + rhs_bias[local, 0].astype(jnp.float32)
    if fuse_act is not None:
        acc = fused_activation(acc, fuse_act)
    out = jnp.where(mine[:, None], acc, 0)
    return out.astype(preferred_element_type or lhs.dtype)


def ragged_gather(x: jax.Array, indices: jax.Array, start: jax.Array, end: jax.Array, **_tuning: Any) -> jax.Array:
    """ragged_gather_v2's own path on a TPU without a SparseCore: every row gathered."""
    del start, end  # rows outside [start, end) are "not meaningful": the kernel skips them, this keeps them
    return x[indices]


def install() -> None:
    """Point fused_moe_gmm's kernel names at the twin (it imported them by name), and the quantized linear
    layers' (a weight with block scales runs through gmm_v2 as one group)."""
    from tpu_inference.kernels.sparse_core import dense_gather_reduce, ragged_gather_reduce_v2
    from tpu_inference.layers.common import fused_moe_gmm, linear

    fused_moe_gmm.gmm_v2 = gmm_v2
    linear.gmm_v2 = gmm_v2
    fused_moe_gmm.dense_gather_reduce = dense_gather_reduce._jax_fallback
    fused_moe_gmm.ragged_gather_reduce = ragged_gather_reduce_v2._fallback_implementation
    fused_moe_gmm.ragged_gather = ragged_gather
