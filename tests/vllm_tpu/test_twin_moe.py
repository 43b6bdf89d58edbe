"""The CPU twin's pure-torch grouped matmul vs a per-group reference, and vLLM's own TPU MoE on it.

`grouped_matmul` stands in for torch_xla's Pallas `gmm` behind the same `xla::gmm` op. Its inputs are laid
out as vLLM 0.13's `moe_pallas.fused_moe` builds them: rows sorted by expert, `group_sizes` from its
histogram (empty experts included), the expert weights `[experts, n, k]` with `transpose_rhs`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# The full stack is the test venv's: missing, these imports fail the run instead of skipping it.
import torch
import vllm  # noqa: F401  (twin.moe stands in for the kernel vLLM's TPU MoE calls)

from aotc.runners.vllm_tpu.twin import moe as twin_moe


def reference_gmm(lhs, rhs, group_sizes, group_offset=0, transpose_rhs=False):
    """Slice by slice: rows of group i times rhs[i - group_offset]; rows of groups rhs lacks stay zero."""
    out = torch.zeros(lhs.shape[0], rhs.shape[1] if transpose_rhs else rhs.shape[2])
    start = 0
    for group, size in enumerate(group_sizes.tolist()):
        local = group - group_offset
        if 0 <= local < rhs.shape[0]:
            weight = rhs[local].float().T if transpose_rhs else rhs[local].float()
            out[start : start + size] = lhs[start : start + size].float() @ weight
        start += size
    return out.to(lhs.dtype)


def random_case(gen, sizes, k=8, n=12, transpose_rhs=False, dtype=torch.float32, groups_held=None):
    m = sum(sizes)
    held = groups_held or len(sizes)
    lhs = torch.randn(m, k, generator=gen).to(dtype)
    rhs = torch.randn(held, n, k, generator=gen) if transpose_rhs else torch.randn(held, k, n, generator=gen)
    return lhs, rhs.to(dtype), torch.tensor(sizes, dtype=torch.int32)


@pytest.mark.parametrize("sizes", [[4, 4, 4, 4], [0, 7, 0, 9], [16, 0, 0, 0], [0, 0, 0, 16], [3, 1, 5, 7]])
@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_grouped_matmul_matches_per_group_reference(sizes, transpose_rhs):
    gen = torch.Generator().manual_seed(sum(sizes) + len(sizes))
    lhs, rhs, group_sizes = random_case(gen, sizes, transpose_rhs=transpose_rhs)
    got = twin_moe.grouped_matmul(lhs, rhs, group_sizes, transpose_rhs=transpose_rhs)
    torch.testing.assert_close(got, reference_gmm(lhs, rhs, group_sizes, transpose_rhs=transpose_rhs))


def test_grouped_matmul_keeps_the_input_dtype_and_accumulates_in_float32():
    gen = torch.Generator().manual_seed(7)
    lhs, rhs, group_sizes = random_case(gen, [5, 3, 0, 8], k=64, dtype=torch.bfloat16)
    got = twin_moe.grouped_matmul(lhs, rhs, group_sizes)
    assert got.dtype == torch.bfloat16  # torch_xla's gmm: preferred_element_type = lhs.dtype
    torch.testing.assert_close(got, reference_gmm(lhs, rhs, group_sizes), rtol=0, atol=0)


def test_grouped_matmul_with_group_offset_computes_only_the_groups_rhs_holds():
    # rhs sharded by expert: this shard holds groups 1 and 2 of 4; the other rows are zero.
    gen = torch.Generator().manual_seed(3)
    lhs, rhs, group_sizes = random_case(gen, [3, 5, 2, 6], groups_held=2)
    got = twin_moe.grouped_matmul(lhs, rhs, group_sizes, group_offset=torch.tensor(1, dtype=torch.int32))
    expected = reference_gmm(lhs, rhs, group_sizes, group_offset=1)
    torch.testing.assert_close(got, expected)
    assert not got[:3].any() and not got[10:].any()


def test_grouped_matmul_rows_past_every_group_are_zero():
    gen = torch.Generator().manual_seed(5)
    lhs, rhs, group_sizes = random_case(gen, [2, 3, 1, 2])
    lhs = torch.cat([lhs, torch.randn(8, lhs.shape[1], generator=gen)])  # 8 rows no group claims
    got = twin_moe.grouped_matmul(lhs, rhs, group_sizes)
    assert not got[8:].any()


def reference_moe(x, w13, w2, gating, topk, renormalize):
    """Token by token, expert by expert (float32): softmax routing, top-k, silu-gated MLP, weighted sum."""
    out = torch.zeros_like(x)
    inter = w2.shape[-1]
    for t in range(x.shape[0]):
        weights, experts = gating[t].softmax(-1).topk(topk)
        if renormalize:
            weights = weights / weights.sum()
        for weight, e in zip(weights, experts.tolist()):
            h = w13[e] @ x[t]
            out[t] += weight * (w2[e] @ (torch.nn.functional.silu(h[:inter]) * h[inter:]))
    return out


def run_vllm_fused_moe_on_xla_cpu() -> dict:
    """vLLM's TPU `fused_moe` on a PJRT CPU device with the twin installed as its worker installs it (subprocess)."""
    os.environ["PJRT_DEVICE"] = "CPU"
    import torch_xla
    from vllm.model_executor.layers.fused_moe.moe_pallas import fused_moe

    twin_moe.install()
    gen = torch.Generator().manual_seed(11)
    tokens, hidden, inter, experts, topk = 16, 32, 24, 8, 2
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    gating = torch.randn(tokens, experts, generator=gen)
    device = torch_xla.device()
    got = fused_moe(x.to(device), w13.to(device), w2.to(device), gating.to(device), topk, experts,
                    renormalize=True).cpu()
    expected = reference_moe(x, w13, w2, gating, topk, renormalize=True)
    return {"max_abs_error": float((got - expected).abs().max()), "scale": float(expected.abs().max()),
            "device": str(got.device), "shape": list(got.shape)}


def test_vllm_tpu_fused_moe_on_the_twin_matches_a_per_expert_reference():
    """The real op path: vLLM 0.13's moe_pallas.fused_moe calls torch.ops.xla.gmm on XLA tensors, which
    install() routed to grouped_matmul (without it: torch_xla's Pallas kernel, 'Jax is required')."""
    out = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["shape"] == [16, 32]
    assert result["max_abs_error"] <= 1e-4 * max(result["scale"], 1.0)


def test_a_process_that_only_resolves_the_twin_platform_does_not_import_torch_xla():
    """vLLM's API server resolves the platform and imports vllm._custom_ops (the platform's import_kernels) but
    never runs a model: the twin must not pull torch_xla in there, or the guard, loaded later, finds torch_xla's
    own XLA_FLAGS instead of the launch flags and calls a matching cache a mismatch."""
    probe = ("import sys; from vllm.platforms import current_platform; import vllm._custom_ops; "
             "print(type(current_platform).__name__, 'torch_xla' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "AOTC_CPU_TWIN": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["CpuTwinTpuPlatform", "False"]


if __name__ == "__main__":
    print(json.dumps(run_vllm_fused_moe_on_xla_cpu()))
