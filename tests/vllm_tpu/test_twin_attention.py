"""The CPU twin's pure-torch KV write + ragged paged attention vs a naive reference.

Inputs are laid out exactly as vLLM's TPU runner builds them (PallasMetadata):
interleaved K/V heads, padded head dim, cu_q_lens garbage past num_seqs,
padding tokens and padding KV-update slices.
"""

from __future__ import annotations

import math

import pytest

# The full stack is the test venv's (CI installs it with `make env`): missing, these imports fail the
# run instead of skipping it.
import torch
import vllm  # noqa: F401  (twin.attention stands in for vLLM's Pallas kernel)

from aotc.runners.vllm_tpu.twin import attention as twin

PAGE = 4


def naive_kv_write(kv, slot_mapping, flat_cache, num_slices):
    out = flat_cache.clone()
    for i in range(int(num_slices[0])):
        start, src, length = (int(x) for x in slot_mapping[:, i])
        out[start : start + length] = kv[src : src + length]
    return out


def naive_attention(q, pages, kv_lens, page_indices, cu, num_seqs, scale, window=None, soft_cap=None):
    out = torch.zeros_like(q)
    kv_heads = pages.shape[2] // 2
    group = q.shape[1] // kv_heads
    for s in range(int(num_seqs[0])):
        q0, q1, kv_len = int(cu[s]), int(cu[s + 1]), int(kv_lens[s])
        rows = pages[page_indices[s].long()].flatten(0, 1)[:kv_len]
        for t in range(q0, q1):
            pos = kv_len - (q1 - q0) + (t - q0)
            for h in range(q.shape[1]):
                k = rows[:, 2 * (h // group)].float()
                v = rows[:, 2 * (h // group) + 1].float()
                scores = k @ q[t, h].float() * scale
                if soft_cap is not None:
                    scores = soft_cap * torch.tanh(scores / soft_cap)
                keep = torch.arange(kv_len) <= pos
                if window is not None:
                    keep &= pos - torch.arange(kv_len) < window
                scores = scores.masked_fill(~keep, -math.inf)
                out[t, h] = (torch.softmax(scores, 0) @ v).to(q.dtype)
    return out


def make_batch(gen, q_lens, ctx_lens, max_seqs=5, pages_per_seq=4, total_pages=24, q_heads=4, kv_heads=2, dim=8):
    """Random cache + metadata for sequences with the given query / context lengths."""
    num_seqs = len(q_lens)
    tokens = 16  # padded token bucket
    q = torch.randn(tokens, q_heads, dim, generator=gen)
    pages = torch.randn(total_pages, PAGE, 2 * kv_heads, dim, generator=gen)
    perm = torch.randperm(total_pages - 1, generator=gen)[: max_seqs * pages_per_seq] + 1
    page_indices = perm.reshape(max_seqs, pages_per_seq).int()
    cu = torch.ones(max_seqs + 1, dtype=torch.int32)  # vLLM pads with 1s past num_seqs
    cu[0] = 0
    cu[1 : num_seqs + 1] = torch.tensor(q_lens).cumsum(0)
    kv_lens = torch.zeros(max_seqs, dtype=torch.int32)
    kv_lens[:num_seqs] = torch.tensor(ctx_lens) + torch.tensor(q_lens)
    return q, pages, kv_lens, page_indices, cu, torch.tensor([num_seqs], dtype=torch.int32)


@pytest.mark.parametrize(
    "q_lens,ctx_lens,window,soft_cap",
    [
        ([3, 1, 5], [0, 7, 2], None, None),  # prefill, decode, chunked prefill
        ([1, 1, 1, 1], [9, 3, 0, 14], None, None),  # pure decode batch
        ([6, 2], [5, 0], 4, None),  # sliding window
        ([4, 3], [2, 6], None, 5.0),  # logit soft cap
    ],
)
def test_ragged_paged_attention_matches_naive_reference(q_lens, ctx_lens, window, soft_cap):
    gen = torch.Generator().manual_seed(sum(q_lens) * 31 + sum(ctx_lens))
    q, pages, kv_lens, page_indices, cu, num_seqs = make_batch(gen, q_lens, ctx_lens)
    got = twin.ragged_paged_attention(
        q, pages, kv_lens, page_indices, cu, num_seqs, sm_scale=0.3, sliding_window=window, soft_cap=soft_cap
    )
    want = naive_attention(q, pages, kv_lens, page_indices, cu, num_seqs, 0.3, window, soft_cap)
    real = int(cu[int(num_seqs[0])])
    torch.testing.assert_close(got[:real], want[:real], rtol=1e-4, atol=1e-5)
    assert torch.count_nonzero(got[real:]) == 0, "padding tokens must not attend"


def slices_for(q_lens, ctx_lens, page_indices):
    """(cache_start, new_kv_start, length) per page-sized piece, as the runner computes them."""
    rows, src = [], 0
    for s, (q_len, ctx) in enumerate(zip(q_lens, ctx_lens)):
        pos = ctx
        while pos < ctx + q_len:
            length = min(PAGE - pos % PAGE, ctx + q_len - pos)
            rows.append((int(page_indices[s, pos // PAGE]) * PAGE + pos % PAGE, src, length))
            src, pos = src + length, pos + length
    return rows


def test_kv_slice_write_matches_naive_reference():
    gen = torch.Generator().manual_seed(0)
    q_lens, ctx_lens = [3, 1, 6], [2, 7, 0]
    _, pages, _, page_indices, _, _ = make_batch(gen, q_lens, ctx_lens)
    rows = slices_for(q_lens, ctx_lens, page_indices)
    padded_slices = len(rows) + 3  # padding slices stay all-zero, as in the runner
    slot_mapping = torch.zeros(3, padded_slices, dtype=torch.int32)
    slot_mapping[:, : len(rows)] = torch.tensor(rows, dtype=torch.int32).T
    num_slices = torch.tensor([len(rows)], dtype=torch.int32)
    kv = torch.randn(16, pages.shape[2], pages.shape[3], generator=gen)
    flat = pages.flatten(0, 1)

    got = twin.write_kv_slices(kv, slot_mapping, flat, num_slices, PAGE)

    torch.testing.assert_close(got, naive_kv_write(kv, slot_mapping, flat, num_slices))
    assert torch.equal(got[:PAGE], flat[:PAGE]), "padding slices point at block 0 and must not write"


def test_write_then_attend_equals_attention_over_fresh_kv():
    """The twin's two halves compose: tokens written this step are attended to."""
    gen = torch.Generator().manual_seed(1)
    q_lens, ctx_lens = [2, 5], [3, 0]
    q, pages, kv_lens, page_indices, cu, num_seqs = make_batch(gen, q_lens, ctx_lens)
    rows = slices_for(q_lens, ctx_lens, page_indices)
    slot_mapping = torch.tensor(rows, dtype=torch.int32).T.contiguous()
    kv = torch.randn(16, pages.shape[2], pages.shape[3], generator=gen)
    flat = twin.write_kv_slices(kv, slot_mapping, pages.flatten(0, 1), torch.tensor([len(rows)]), PAGE)
    new_pages = flat.unflatten(0, (pages.shape[0], PAGE))
    got = twin.ragged_paged_attention(q, new_pages, kv_lens, page_indices, cu, num_seqs, sm_scale=1.0)
    want = naive_attention(q, new_pages, kv_lens, page_indices, cu, num_seqs, 1.0)
    torch.testing.assert_close(got[:7], want[:7], rtol=1e-4, atol=1e-5)
