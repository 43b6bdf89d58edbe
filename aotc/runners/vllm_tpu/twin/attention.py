"""Pallas attention twin: the same inputs as vLLM's TPU backend, plain torch inside.

The runner builds one `PallasMetadata` per step; vLLM's backend hands it to two
Pallas kernels (paged KV write, ragged paged attention) that only exist on a TPU.
This module keeps every input and shape identical and swaps the two kernels for
static-shape torch ops, so the graphs compiled on PJRT CPU have the same inputs,
shapes and bucket structure as on a TPU. Nothing here may branch on tensor
values: a data-dependent Python branch would be baked into the graph.

vLLM traces the backbone once with dynamo and re-runs that FX graph for every
bucket, so a Python int read from a shape that is not marked dynamic (e.g. the
slot-mapping width) is frozen at the first bucket's value. Index ranges are
therefore built from tensors (`_iota_like`) and reshapes avoid explicit sizes.
"""

from __future__ import annotations

import torch
from vllm.utils.math_utils import cdiv
from vllm.v1.attention.backends.pallas import (
    TPU_HEAD_SIZE_ALIGNMENT,
    PallasAttentionBackend,
    PallasAttentionBackendImpl,
    PallasMetadata,
)

# Same default as torch_xla's ragged paged attention kernel.
MASK_VALUE = -0.7 * float(torch.finfo(torch.float32).max)


def write_kv_slices(
    kv: torch.Tensor,
    slot_mapping: torch.Tensor,
    flat_cache: torch.Tensor,
    num_slices: torch.Tensor,
    page_size: int,
) -> torch.Tensor:
    """Return `flat_cache` with the slices described by `slot_mapping` written.

    kv: [num_tokens, combined_heads, head_dim]; flat_cache: [pages * page_size,
    combined_heads, head_dim]; slot_mapping: [3, padded_slices] rows
    (cache_start, new_kv_start, length); num_slices: [1] valid slice count.
    A slice never exceeds a page, so each slice is expanded to page_size rows.
    Rows past a slice's length, or of a padding slice, are routed to one spare
    row appended to the cache and dropped afterwards: a scatter with duplicate
    targets has no defined winner, so invalid rows must not alias real slots.
    """
    cache_start, kv_start, length = slot_mapping[0], slot_mapping[1], slot_mapping[2]
    offsets = torch.arange(page_size, device=kv.device, dtype=slot_mapping.dtype)
    slice_ids = _iota_like(cache_start)
    valid = (offsets[None, :] < length[:, None]) & (slice_ids < num_slices)[:, None]
    spare_row = flat_cache.shape[0]
    dst = torch.where(valid, cache_start[:, None] + offsets[None, :], spare_row)
    src = torch.where(valid, kv_start[:, None] + offsets[None, :], 0)
    src = torch.minimum(src, _iota_like(kv[:, 0, 0], src.dtype)[-1])
    padded = torch.cat([flat_cache, flat_cache[:1]], dim=0)
    padded = padded.index_copy(0, dst.reshape(-1).long(), kv[src.reshape(-1).long()])
    return padded[:spare_row]


def ragged_paged_attention(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    kv_lens: torch.Tensor,
    page_indices: torch.Tensor,
    cu_q_lens: torch.Tensor,
    num_seqs: torch.Tensor,
    *,
    sm_scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
) -> torch.Tensor:
    """Static-shape equivalent of torch_xla's ragged_paged_attention.

    q: [tokens, q_heads, head_dim]; kv_pages: [pages, page_size, 2 * kv_heads,
    head_dim] with K and V interleaved on dim 2; kv_lens: [max_seqs];
    page_indices: [max_seqs, pages_per_seq]; cu_q_lens: [max_seqs + 1];
    num_seqs: [1]. Tokens past the last real sequence return zeros. Entries of
    cu_q_lens past num_seqs are garbage (vLLM fills them with 1), so sequence
    membership is masked with num_seqs rather than trusted.
    """
    num_q_heads = q.shape[1]
    num_kv_heads = kv_pages.shape[2] // 2

    token = _iota_like(q[:, 0, 0], cu_q_lens.dtype)
    seq_ids = _iota_like(kv_lens, cu_q_lens.dtype)
    real_seq = seq_ids < num_seqs
    starts, ends = cu_q_lens[:-1], cu_q_lens[1:]
    member = real_seq[None, :] & (starts[None, :] <= token[:, None]) & (token[:, None] < ends[None, :])
    has_seq = member.any(dim=1)
    seq_of_token = member.to(torch.int32).argmax(dim=1)

    q_len = (ends - starts)[seq_of_token]
    kv_len = kv_lens[seq_of_token]
    # Absolute position of each query token inside its sequence.
    q_pos = kv_len - q_len + (token - starts[seq_of_token])

    # [max_seqs, pages_per_seq * page_size, combined_heads, head_dim], then one
    # row per token.
    seq_kv = kv_pages[page_indices.long()].flatten(1, 2)
    token_kv = seq_kv[seq_of_token.long()]
    k = _dequant(token_kv[:, :, 0::2, :], k_scale, q.dtype)
    v = _dequant(token_kv[:, :, 1::2, :], v_scale, q.dtype)
    group = num_q_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)

    scores = torch.einsum("thd,tkhd->thk", q.float(), k.float()) * sm_scale
    if soft_cap is not None:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    key_pos = _iota_like(seq_kv[0, :, 0, 0], kv_len.dtype)
    allowed = (key_pos[None, :] <= q_pos[:, None]) & (key_pos[None, :] < kv_len[:, None])
    if sliding_window is not None:
        allowed &= q_pos[:, None] - key_pos[None, :] < sliding_window
    scores = scores.masked_fill(~allowed[:, None, :], MASK_VALUE)
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("thk,tkhd->thd", probs, v.float()).to(q.dtype)
    return torch.where(has_seq[:, None, None], out, torch.zeros_like(out))


def _iota_like(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """0..len(x)-1, sized by x at run time rather than by a traced int."""
    return torch.cumsum(torch.ones_like(x, dtype=dtype or x.dtype), 0) - 1


def _dequant(x: torch.Tensor, scale: float | None, dtype: torch.dtype) -> torch.Tensor:
    if scale is None:
        return x.to(dtype)
    return (x.to(torch.float32) * scale).to(dtype)


def _pad_head(x: torch.Tensor, padded: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, padded - x.shape[-1]), value=0.0)


class TwinPallasAttentionImpl(PallasAttentionBackendImpl):
    """vLLM's Pallas impl with the two TPU kernels replaced; same inputs."""

    def forward(
        self,
        layer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: PallasMetadata,
        output: torch.Tensor | None = None,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fused output quantization is not supported")
        # vLLM's memory-profiling pass runs with empty caches.
        if kv_cache.numel() == 0:
            return torch.ones_like(query) if output is None else output

        hidden_size = query.shape[1]
        padded = cdiv(self.head_size, TPU_HEAD_SIZE_ALIGNMENT) * TPU_HEAD_SIZE_ALIGNMENT
        query = _pad_head(query.view(-1, self.num_heads, self.head_size), padded)
        key = _pad_head(key.view(-1, self.num_kv_heads, self.head_size), padded)
        value = _pad_head(value.view(-1, self.num_kv_heads, self.head_size), padded)

        if self.kv_sharing_target_layer_name is None:
            self._write_kv(key, value, kv_cache, attn_metadata, layer)
        if self.kv_cache_quantized_dtype is not None and (
            layer._k_scale_float == 0.0 or layer._v_scale_float == 0.0
        ):
            raise ValueError("k_scale_float and v_scale_float must be non-zero")

        out = ragged_paged_attention(
            query,
            kv_cache,
            attn_metadata.context_lens,
            attn_metadata.block_tables,
            attn_metadata.query_start_loc,
            attn_metadata.num_seqs,
            sm_scale=self.scale,
            sliding_window=self.sliding_window,
            soft_cap=self.logits_soft_cap,
            k_scale=layer._k_scale_float,
            v_scale=layer._v_scale_float,
        )
        return out[:, :, : self.head_size].reshape(-1, hidden_size)

    def _write_kv(self, key, value, kv_cache, meta: PallasMetadata, layer) -> None:
        _, page_size, combined_heads, head_dim = kv_cache.shape
        if self.kv_cache_quantized_dtype is not None:
            key = _quantize(key, layer._k_scale_float, self.kv_cache_quantized_dtype)
            value = _quantize(value, layer._v_scale_float, self.kv_cache_quantized_dtype)
        kv = torch.cat([key, value], dim=-1).reshape(-1, combined_heads, head_dim)
        # Same buffer donation as vLLM's TPU path, so the cache updates in place.
        torch.ops.xla.dynamo_set_buffer_donor_(kv_cache, True)
        flat = kv_cache.flatten(0, 1)
        flat.copy_(write_kv_slices(kv, meta.slot_mapping, flat, meta.num_kv_update_slices, page_size))


def _quantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    info = torch.finfo(dtype)
    return torch.clamp(x.to(torch.float32) / scale, info.min, info.max).to(dtype)


class TwinPallasAttentionBackend(PallasAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[TwinPallasAttentionImpl]:
        return TwinPallasAttentionImpl


def flash_attention(q, k, v, causal=False, q_segment_ids=None, kv_segment_ids=None, sm_scale=1.0, *, ab=None,
                    partition_spec=None, mesh=None) -> torch.Tensor:
    """torch_xla's Pallas `flash_attention` (vLLM 0.13's vision-encoder attention on a TPU) in plain torch.

    q: [batch, heads, q_len, head_dim], k and v: [batch, heads, kv_len, head_dim]; the result has q's shape and
    dtype, the products accumulated in float32 as the kernel does. Only what vLLM's `MultiHeadAttention` can
    pass is taken (causal and a bias included); segment ids and SPMD sharding are not twinned.
    """
    if q_segment_ids is not None or kv_segment_ids is not None or partition_spec is not None:
        raise NotImplementedError("the CPU twin's flash_attention takes no segment ids and no sharding")
    logits = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float())
    if ab is not None:  # before the scaling, as the kernel adds it
        logits = logits + ab.float()
    logits = logits * sm_scale
    if causal:
        rows = _iota_like(logits[0, 0, :, 0], torch.int32)
        cols = _iota_like(logits[0, 0, 0, :], torch.int32)
        logits = torch.where(cols[None, :] <= rows[:, None], logits, MASK_VALUE)
    weights = torch.softmax(logits, dim=-1)
    return torch.einsum("bhqk,bhkd->bhqd", weights, v.float()).to(q.dtype)


def install_vision_attention() -> None:
    """vLLM's `MultiHeadAttention` imports torch_xla's `flash_attention` at each call: the twin's from now on."""
    import torch_xla.experimental.custom_kernel as custom_kernel

    custom_kernel.flash_attention = flash_attention
