"""A jittable pure-JAX stand-in for tpu-inference's fused conv1d + gated delta net kernel (kernels/gdn/v3, Pallas),
for the CPU twin: the linear-attention layers of hybrid models (Qwen3-Next; vLLM's model through torchax).

Per sequence of a ragged batch the kernel runs a causal depthwise conv1d over the sequence's last kernel_size - 1
inputs (its conv state) and its new tokens, SiLU, then the gated delta rule from its recurrent state, and writes
both states to the sequence's slot; a sequence with no context starts from zeros. The stand-in does the conv here
and hands the rest to the stack's own pure-JAX reference (kernels/gdn/reference: ragged_gated_delta_rule, SiLU
included), so inputs, outputs and shapes are the kernel's and the recurrence is the stack's.
"""

from __future__ import annotations

import jax.numpy as jnp


def fused_conv1d_gdn(qkv, b, a, conv_state, recurrent_state, conv_weight, conv_bias, a_log, dt_bias, query_start_loc,
                     state_indices, distribution, seq_lens, read_state_indices, read_offsets=None, *, n_kq, n_v, d_k,
                     d_v, kernel_size, num_spec_tokens=0, **tiling):
    """kernels.gdn.v3.wrapper.fused_conv1d_gdn, each sequence in one slot-to-slot step (no speculative windows).
    ``tiling``: the kernel's tile sizes and precision, which change no shape."""
    from tpu_inference.kernels.gdn.reference.ragged_gated_delta_rule_ref import ragged_gated_delta_rule

    if num_spec_tokens:
        raise NotImplementedError("aotc's CPU twin of the GDN kernel takes no speculative verify windows")
    num_tokens, num_seqs = qkv.shape[0], state_indices.shape[0]
    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    has_initial_state = (seq_lens - query_lens) > 0
    valid_seq = jnp.arange(num_seqs) < distribution[2]
    # a sequence's slot: read from read_state_indices (a prefix-cache hit's block), written to state_indices
    write_slots = jnp.where(valid_seq, state_indices, recurrent_state.shape[0])  # past the end: dropped
    recurrent_state = recurrent_state.at[write_slots].set(recurrent_state[read_state_indices], mode="drop")

    history = kernel_size - 1
    prev = jnp.where(has_initial_state[:, None, None], conv_state[read_state_indices], 0).astype(jnp.float32)
    x = qkv.astype(jnp.float32)
    token = jnp.arange(num_tokens)
    seq = jnp.clip(jnp.sum(token[:, None] >= query_start_loc[None, 1:], axis=1), 0, num_seqs - 1)
    valid_token = token < query_start_loc[distribution[2]]

    def conv_rows(seqs, rows):
        """Rows of each sequence's conv input: its conv state (rows below `history`), then its tokens."""
        from_state = prev[seqs, jnp.clip(rows, 0, history - 1)]
        from_tokens = x[jnp.clip(query_start_loc[seqs] + rows - history, 0, num_tokens - 1)]
        return jnp.where((rows < history)[..., None], from_state, from_tokens)

    weight = conv_weight[:, 0, :].astype(jnp.float32)  # [dim, kernel_size]; the last tap is the token itself
    place = token - query_start_loc[seq]
    conv = sum(conv_rows(seq, place + tap) * weight[:, tap] for tap in range(kernel_size))
    if conv_bias is not None:
        conv = conv + conv_bias.astype(jnp.float32)
    conv = jnp.where(valid_token[:, None], conv, 0).astype(qkv.dtype)

    every_seq = jnp.arange(num_seqs)[:, None]
    new_conv_state = conv_rows(every_seq, query_lens[:, None] + jnp.arange(history)[None, :])
    conv_state = conv_state.at[write_slots].set(new_conv_state.astype(conv_state.dtype), mode="drop")

    recurrent_state, output = ragged_gated_delta_rule(
        conv, b, a, recurrent_state, a_log, dt_bias, query_start_loc, state_indices, distribution, has_initial_state,
        n_kq=n_kq, n_v=n_v, d_k=d_k, d_v=d_v)
    return (conv_state, recurrent_state), jnp.where(valid_token[:, None], output, 0)


def install() -> None:
    """run_jax_gdn_attention takes its kernel from the linear-attention backend at each call: the stand-in now."""
    from tpu_inference.layers.common import attention_backend

    attention_backend.GDNLinearAttentionBackend.conv1d_gdn_kernel = lambda self: fused_conv1d_gdn
