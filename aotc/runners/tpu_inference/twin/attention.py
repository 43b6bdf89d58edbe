"""A jittable pure-JAX stand-in for tpu-inference's ragged paged attention (RPA v3), for the CPU twin.

The Pallas kernel needs a TPU; its reference implementation loops over sequences in Python (not
jittable); Pallas interpret mode fails inside generation. This one is vectorized over tokens: each token
finds its sequence through `cu_q_lens`, its new K/V is scattered into its page, and it attends over its
sequence's pages with a causal (and optional sliding-window) mask. Same signature, same KV-cache layout
(`merge_kv`: K and V interleaved per head, packed, head_dim padded to 128), same outputs.
The head_dim-64 variant (GPT-OSS) differs only in its cache layout (each head's K and V side by side in
one 128-wide row) and its attention sinks (one extra logit per query head in the softmax).
Multi-head latent attention (MLA v2: DeepSeek V3, Kimi K2) keeps one latent row per token, the compressed KV
then the shared rope key, each padded to 128 lanes; every query head attends over that row and takes the
latent as its value.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from tpu_inference.kernels.mla.v2.kernel import align_to
from tpu_inference.kernels.ragged_paged_attention.v3 import kernel_hd64
from tpu_inference.kernels.ragged_paged_attention.v3.kernel import merge_kv

LANES = 128


def _token_positions(cu_q_lens, kv_lens, num_seqs, num_tokens):
    """(sequence id, position in its sequence, is a real token) for every padded token slot."""
    t = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu_q_lens[1:], t, side="right"), 0, kv_lens.shape[0] - 1).astype(jnp.int32)
    real = t < cu_q_lens[num_seqs]
    q_len = cu_q_lens[seq + 1] - cu_q_lens[seq]
    pos = kv_lens[seq] - q_len + (t - cu_q_lens[seq])
    return seq, pos, real


def _write_kv(kv_cache, merged, page_table, seq, pos, real):
    num_pages, page_size = kv_cache.shape[:2]
    page = page_table[seq, jnp.clip(pos // page_size, 0, page_table.shape[1] - 1)]
    page = jnp.where(real, page, num_pages)  # out of range: dropped
    return kv_cache.at[page, pos % page_size].set(merged.astype(kv_cache.dtype), mode="drop")


def _unpack_kv(pages, num_kv_heads, head_dim):
    """[..., page, slot, heads_x2/packing, packing, padded_dim] -> k, v of [..., len, kv_heads, head_dim]."""
    padded_dim = pages.shape[-1]
    lead = pages.shape[:-5]
    kv = pages.reshape(*lead, -1, pages.shape[-3] * pages.shape[-2], padded_dim)
    kv = kv[..., : num_kv_heads * 2, :].reshape(*lead, -1, num_kv_heads, 2 * padded_dim)
    return kv[..., :head_dim], kv[..., padded_dim : padded_dim + head_dim]


def _unpack_kv_hd64(pages, num_kv_heads, head_dim):
    """[..., page, slot, heads/packing, packing, 2 * head_dim] -> k, v of [..., len, kv_heads, head_dim]."""
    lead = pages.shape[:-5]
    kv = pages.reshape(*lead, -1, pages.shape[-3] * pages.shape[-2], pages.shape[-1])[..., :num_kv_heads, :]
    return kv[..., :head_dim], kv[..., head_dim : 2 * head_dim]


def _softmax_with_sinks(scores, sinks):
    """Softmax over each row's keys plus its head's sink logit, which takes probability but adds no value."""
    if sinks is None:
        return jax.nn.softmax(scores, axis=-1)
    sink = jnp.broadcast_to(sinks.reshape(1, *scores.shape[1:3], 1).astype(scores.dtype), (*scores.shape[:3], 1))
    return jax.nn.softmax(jnp.concatenate([sink, scores], axis=-1), axis=-1)[..., 1:]


def ragged_paged_attention(*arrays: jax.Array, **options: Any):
    """The RPA v3 kernel: _paged_attention's eight arrays and keywords, no sinks."""
    return _paged_attention(*arrays, None, merge=merge_kv, unpack=_unpack_kv, **options)


def ragged_paged_attention_hd64(*arrays: jax.Array, attention_sink: jax.Array | None = None, **options: Any):
    """The head_dim-64 kernel: the same eight arrays, then (positional or not) its sinks, f32[q_heads]."""
    sinks = arrays[8] if len(arrays) > 8 else attention_sink
    return _paged_attention(*arrays[:8], sinks, merge=kernel_hd64.merge_kv, unpack=_unpack_kv_hd64, **options)


def _paged_attention(
    queries: jax.Array,  # [T, q_heads, head_dim]
    keys: jax.Array,  # [T, kv_heads, head_dim]
    values: jax.Array,
    kv_cache: jax.Array,  # [pages, page_size, ...] in merge's layout, which unpack reads back
    kv_lens: jax.Array,  # i32[max_num_seqs]
    page_indices: jax.Array,  # i32[max_num_seqs * pages_per_seq]
    cu_q_lens: jax.Array,  # i32[max_num_seqs + 1]
    distribution: jax.Array,  # i32[3]; distribution[2] is the number of sequences
    sinks: jax.Array | None,  # f32[q_heads]
    *,
    merge: Any,
    unpack: Any,
    use_causal_mask: bool = True,
    update_kv_cache: bool = True,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    out_dtype: Any = None,
    mask_value: float | None = None,
    q_scale: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    **_tuning: Any,  # block sizes, vmem limits, debug flags: meaningless off the TPU
):
    num_tokens, num_q_heads, head_dim = queries.shape
    num_kv_heads = keys.shape[1]
    out_dtype = out_dtype or (jnp.float32 if queries.dtype == jnp.float32 else jnp.bfloat16)
    mask_value = jnp.finfo(out_dtype).min if mask_value is None else mask_value
    max_num_seqs = kv_lens.shape[0]
    page_table = page_indices.reshape(max_num_seqs, -1)

    seq, pos, real = _token_positions(cu_q_lens, kv_lens, distribution[2], num_tokens)
    if update_kv_cache:
        kv_cache = _write_kv(kv_cache, merge(keys, values), page_table, seq, pos, real)

    # Per sequence first ([seqs, kv_heads, len, dim], query heads grouped onto their KV head), then one
    # bf16 row gather per token: no per-token repeat or f32 copy of the KV (the twin's cost on CPU).
    k, v = (jnp.swapaxes(x, 1, 2)[seq] for x in unpack(kv_cache[page_table], num_kv_heads, head_dim))
    q = queries.reshape(num_tokens, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    if q_scale is not None:
        q = (q / q_scale).astype(k.dtype)
    scores = _scaled(jnp.einsum("tgqd,tgkd->tgqk", q, k, preferred_element_type=jnp.float32) * sm_scale,
                     k_scale, q_scale, soft_cap)

    mask = _visible(k.shape[2], kv_lens[seq], pos, use_causal_mask, sliding_window)
    scores = jnp.where(mask[:, None, None, :], scores, mask_value)
    probs = _softmax_with_sinks(scores, sinks).astype(v.dtype)
    out = jnp.einsum("tgqk,tgkd->tgqd", probs, v, preferred_element_type=jnp.float32)
    out = out.reshape(num_tokens, num_q_heads, head_dim)
    if v_scale is not None:
        out = out * v_scale
    out = jnp.where(real[:, None, None], out, 0).astype(out_dtype)
    return out, kv_cache


def _scaled(scores, k_scale: float | None, q_scale: float | None, soft_cap: float | None):
    """The logits times the quantized K and Q scales, then soft-capped, as the kernels do."""
    for scale in (k_scale, q_scale):
        if scale is not None:
            scores = scores * scale
    if soft_cap is not None:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    return scores


def _visible(length: int, kv_len, pos, causal: bool, sliding_window: int | None):
    """bool[tokens, length]: the keys each token attends to, of its sequence's `length` slots."""
    kv_pos = jnp.arange(length, dtype=jnp.int32)[None, :]
    mask = kv_pos < kv_len[:, None]
    if causal:
        mask &= kv_pos <= pos[:, None]
        if sliding_window is not None:
            mask &= pos[:, None] < kv_pos + sliding_window
    return mask


def mla_ragged_paged_attention(
    ql_nope: jax.Array,  # [q_heads, T, lkv]: the queries absorbed into the latent space, head-major
    q_pe: jax.Array,  # [T, q_heads, r]
    new_kv_c: jax.Array,  # [T, lkv]
    new_k_pe: jax.Array,  # [T, r]
    cache_kv: jax.Array,  # [pages, page_size / packing, packing, align(lkv, 128) + align(r, 128)]
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    distribution: jax.Array,
    *,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    mask_value: float | None = None,
    q_scale: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    transpose_kv_cache: bool = False,
    **_tuning: Any,  # block sizes, batch and split sizes, vmem limit, s_dtype: the kernel's tiling
):
    """MLA v2 (tpu_inference.kernels.mla.v2.kernel): each token's latent row written into its page, then
    softmax(q_nope . kv_c + q_pe . k_pe) . kv_c per head. Returns ([q_heads, T, lkv], the cache)."""
    if transpose_kv_cache:
        raise NotImplementedError("the twin's MLA keeps the default cache layout (MLA_TRANSPOSE_KV_CACHE unset)")
    num_heads, num_tokens, lkv = ql_nope.shape
    rope_dim = q_pe.shape[-1]
    num_pages, per_packing, packing, width = cache_kv.shape
    nope_dim = align_to(lkv, LANES)  # where the rope key starts in a cache row
    rows = cache_kv.reshape(num_pages, per_packing * packing, width)  # token t of a page at slot t
    max_num_seqs = kv_lens.shape[0]
    page_table = page_indices.reshape(max_num_seqs, -1)

    seq, pos, real = _token_positions(cu_q_lens, kv_lens, distribution[2], num_tokens)
    new_rows = jnp.concatenate([jnp.pad(new_kv_c, ((0, 0), (0, nope_dim - lkv))),
                                jnp.pad(new_k_pe, ((0, 0), (0, width - nope_dim - rope_dim)))], axis=-1)
    rows = _write_kv(rows, new_rows, page_table, seq, pos, real)

    latent = rows[page_table].reshape(max_num_seqs, -1, width)[seq]  # [T, len, width]
    kv_c, k_pe = latent[..., :lkv], latent[..., nope_dim : nope_dim + rope_dim]
    q_nope = jnp.swapaxes(ql_nope, 0, 1)
    scores = _scaled((jnp.einsum("tnl,tkl->tnk", q_nope, kv_c, preferred_element_type=jnp.float32)
                      + jnp.einsum("tnr,tkr->tnk", q_pe, k_pe, preferred_element_type=jnp.float32)) * sm_scale,
                     k_scale, q_scale, soft_cap)
    mask = _visible(latent.shape[1], kv_lens[seq], pos, True, sliding_window)
    scores = jnp.where(mask[:, None, :], scores, jnp.finfo(jnp.float32).min if mask_value is None else mask_value)
    probs = jax.nn.softmax(scores, axis=-1).astype(kv_c.dtype)
    out = jnp.einsum("tnk,tkl->tnl", probs, kv_c, preferred_element_type=jnp.float32)
    if v_scale is not None:
        out = out * v_scale
    out = jnp.where(real[:, None, None], out, 0).astype(ql_nope.dtype)
    return jnp.swapaxes(out, 0, 1), rows.reshape(cache_kv.shape)


def flash_attention(q, k, v, ab=None, segment_ids=None, *, causal: bool = False, sm_scale: float = 1.0,
                    block_sizes: Any = None, vmem_limit_bytes: int | None = None, debug: bool = False):
    """tpu-inference's flash attention (vision encoders: Qwen2.5-VL's windowed and full attention), as its own
    dense reference: the same segment mask, causal mask and scale; tiling and VMEM sizing, which need a TPU,
    dropped."""
    from tpu_inference.kernels.flash_attention.kernel import mha_reference_no_custom_vjp

    return mha_reference_no_custom_vjp(q, k, v, ab, segment_ids, causal=causal, sm_scale=sm_scale)
