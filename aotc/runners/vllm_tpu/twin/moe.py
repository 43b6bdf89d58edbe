"""Grouped-matmul twin: torch_xla's Pallas `gmm` (vLLM 0.13's TPU MoE) in plain torch, same op.

On a TPU, vLLM's `UnquantizedFusedMoEMethod.forward_tpu` runs `moe_pallas.fused_moe`: routing, sorting
and the histogram of rows per expert in torch, then two `torch.ops.xla.gmm` calls, torch_xla's megablox
Pallas kernel (through JAX), which has no CPU lowering. Only that op's XLA kernel is replaced here, so
dynamo traces the very same FX graph (the same `xla::gmm` nodes, inputs and shapes) and only the body the
op lowers to differs, as the attention twin does for ragged paged attention. Nothing may branch on tensor
values: row membership is a mask built from `group_sizes` at run time.
"""

from __future__ import annotations

import torch

from .attention import _iota_like

# Kept alive for the process: dropping a torch.library.Library deregisters its kernels.
_LIBRARY: list[torch.library.Library] = []


def grouped_matmul(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    group_sizes: torch.Tensor,
    tiling: list[int] | None = None,
    group_offset: torch.Tensor | None = None,
    transpose_rhs: bool = False,
) -> torch.Tensor:
    """`lhs[start_i:end_i] @ rhs[i]` for each group i, as megablox `gmm` computes it.

    lhs: [m, k], rows sorted by group; rhs: [groups_here, k, n] ([groups_here, n, k] with transpose_rhs);
    group_sizes: [groups] rows per group, int32; group_offset: the first group of group_sizes that rhs
    holds (rhs sharded by group), None for 0. Products accumulate in float32 and the result has lhs's
    dtype, like torch_xla's call (preferred_element_type = lhs.dtype). Rows in no group of rhs are
    zero (the kernel zeroes them when rhs holds a subset and leaves them unspecified otherwise).
    `tiling` only shapes the kernel's blocks on a TPU and does not change the result.
    """
    assert lhs.dim() == 2, "lhs must be a 2d, torch.Tensor with shape [m, k]"
    assert rhs.dim() == 3, "rhs must be a 3d torch.Tensor with shape [num_groups, k, n]"
    weights = rhs.transpose(1, 2) if transpose_rhs else rhs
    starts, ends = _row_ranges(group_sizes, group_offset, weights)
    row = _iota_like(lhs[:, 0], ends.dtype)
    lhs32 = lhs.float()
    out = torch.zeros(lhs.shape[0], weights.shape[2], dtype=torch.float32, device=lhs.device)
    # One masked matmul per group: memory stays [m, n] (gathering a weight per row would be [m, k, n]).
    for group in range(weights.shape[0]):
        rows = (starts[group] <= row) & (row < ends[group])
        out = torch.where(rows[:, None], lhs32 @ weights[group].float(), out)
    return out.to(lhs.dtype)


def _row_ranges(group_sizes: torch.Tensor, group_offset: torch.Tensor | None, weights: torch.Tensor):
    """[start, end) rows of each group rhs holds: groups group_offset .. group_offset + len(rhs) - 1."""
    ends = torch.cumsum(group_sizes, 0, dtype=group_sizes.dtype)
    starts = ends - group_sizes
    local = _iota_like(weights[:, 0, 0], group_sizes.dtype)
    held = local if group_offset is None else local + group_offset.to(group_sizes.dtype)
    return starts[held.long()], ends[held.long()]


def install() -> None:
    """Make `torch.ops.xla.gmm` on XLA tensors run `grouped_matmul` in this process (idempotent)."""
    if _LIBRARY:
        return
    # Defines xla::gmm and registers its Pallas kernel first, so this registration is the override.
    import torch_xla.experimental.custom_kernel  # noqa: F401

    library = torch.library.Library("xla", "IMPL")
    library.impl("gmm", grouped_matmul, "XLA", allow_override=True)
    _LIBRARY.append(library)
