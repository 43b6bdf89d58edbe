"""Runs under the JAX venv (tests/tpu_inference/conftest.py: run_jax): the CPU twin's GDN kernel, called the way the
stack calls it (run_jax_gdn_attention, which takes the linear-attention backend's kernel), against a plain numpy
loop over each sequence's tokens.

stdout (last line): {"cases", "output_error", "conv_state_error", "recurrent_state_error", "untouched_slots_error",
                     "kernel_is_the_twin"}
"""

import json

import jax
import numpy as np

from aotc.runners.tpu_inference import twin

twin.install()

from tpu_inference.layers.common.attention_backend import GDNLinearAttentionBackend  # noqa: E402
from tpu_inference.layers.common.gdn_attention import run_jax_gdn_attention  # noqa: E402

from aotc.runners.tpu_inference.twin import gdn as twin_gdn  # noqa: E402

N_KQ, N_V, D_K, D_V, KERNEL = 2, 4, 8, 8, 4
DIM = 2 * N_KQ * D_K + N_V * D_V
TOKENS, MAX_SEQS, SLOTS = 32, 6, 9
rng = np.random.default_rng(0)


def normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def silu(x):
    return x / (1 + np.exp(-x))


def unit(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def loop_reference(qkv, b, a, conv_state, recurrent, weight, bias, a_log, dt_bias, starts, seq_lens, write, read):
    """Token by token: the conv over the sequence's history, SiLU, the gated delta rule (vLLM's recurrence:
    decay the state, correct it toward v along k with strength beta, read it with q)."""
    conv_state, recurrent, out = conv_state.copy(), recurrent.copy(), np.zeros((len(qkv), N_V * D_V), np.float32)
    for s in range(len(starts) - 1):
        lo, hi = starts[s], starts[s + 1]
        context = seq_lens[s] > hi - lo
        history = conv_state[read[s]] if context else np.zeros((KERNEL - 1, DIM), np.float32)
        state = recurrent[read[s]].copy() if context else np.zeros((N_V, D_K, D_V), np.float32)
        rows = np.concatenate([history, qkv[lo:hi]])
        for i in range(hi - lo):
            x = silu(sum(rows[i + tap] * weight[:, 0, tap] for tap in range(KERNEL)) + bias)
            q, k = (np.repeat(unit(x[j * N_KQ * D_K:(j + 1) * N_KQ * D_K].reshape(N_KQ, D_K)), N_V // N_KQ, 0)
                    for j in (0, 1))
            v = x[2 * N_KQ * D_K:].reshape(N_V, D_V)
            q = q * D_K ** -0.5
            beta = 1 / (1 + np.exp(-b[lo + i]))
            decay = np.exp(-np.exp(a_log) * np.log1p(np.exp(a[lo + i] + dt_bias)))
            for h in range(N_V):
                correction = beta[h] * (v[h] - decay[h] * (k[h] @ state[h]))
                out[lo + i, h * D_V:(h + 1) * D_V] = decay[h] * (q[h] @ state[h]) + (q[h] @ k[h]) * correction
                state[h] = state[h] * decay[h] + np.outer(k[h], correction)
        conv_state[write[s]], recurrent[write[s]] = rows[hi - lo:], state
    return conv_state, recurrent, out


mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
errors = {"output_error": 0.0, "conv_state_error": 0.0, "recurrent_state_error": 0.0, "untouched_slots_error": 0.0}
CASES = 24
for case in range(CASES):
    seqs = int(rng.integers(1, MAX_SEQS + 1))
    query_lens = rng.integers(1, 6, seqs)
    context = np.where(rng.random(seqs) < 0.5, 0, rng.integers(1, 9, seqs))
    starts = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    padded_starts = np.concatenate([starts, np.full(MAX_SEQS - seqs, starts[-1])]).astype(np.int32)
    seq_lens = np.concatenate([query_lens + context, np.zeros(MAX_SEQS - seqs)]).astype(np.int32)
    slots = rng.permutation(np.arange(1, SLOTS))
    write = np.concatenate([slots[:seqs], np.zeros(MAX_SEQS - seqs)]).astype(np.int32)
    # every third case a sequence resumes from another slot (a prefix-cache hit's state)
    read = np.where((np.arange(MAX_SEQS) == 0) & (case % 3 == 0), slots[-1], write).astype(np.int32)
    qkv, b, a = normal(TOKENS, DIM), normal(TOKENS, N_V), normal(TOKENS, N_V)
    conv_state, recurrent = normal(SLOTS, KERNEL - 1, DIM), normal(SLOTS, N_V, D_K, D_V) * 0.3
    weight, bias, a_log, dt_bias = normal(DIM, 1, KERNEL) * 0.5, normal(DIM), normal(N_V) * 0.2, normal(N_V) * 0.2
    (conv_ours, recurrent_ours), out_ours = jax.jit(
        lambda *args: run_jax_gdn_attention(*args, n_kq=N_KQ, n_v=N_V, d_k=D_K, d_v=D_V, kernel_size=KERNEL,
                                            mesh=mesh, read_state_indices=read))(
        qkv, b, a, conv_state, recurrent, weight, bias, a_log, dt_bias, write, padded_starts,
        np.array([0, 0, seqs], np.int32), seq_lens)
    conv_loop, recurrent_loop, out_loop = loop_reference(qkv, b, a, conv_state, recurrent, weight, bias, a_log,
                                                          dt_bias, starts, seq_lens, write, read)
    written = sorted(set(write[:seqs]))
    untouched = sorted(set(range(1, SLOTS)) - set(written))  # slot 0 is the kernel's null block
    errors["output_error"] = max(errors["output_error"], float(np.abs(np.asarray(out_ours) - out_loop).max()))
    errors["conv_state_error"] = max(errors["conv_state_error"],
                                     float(np.abs(np.asarray(conv_ours)[written] - conv_loop[written]).max()))
    errors["recurrent_state_error"] = max(errors["recurrent_state_error"], float(
        np.abs(np.asarray(recurrent_ours)[written] - recurrent_loop[written]).max()))
    errors["untouched_slots_error"] = max(
        errors["untouched_slots_error"],
        float(np.abs(np.asarray(conv_ours)[untouched] - conv_state[untouched]).max(initial=0)),
        float(np.abs(np.asarray(recurrent_ours)[untouched] - recurrent[untouched]).max(initial=0)))

print(json.dumps({"cases": CASES, **errors,
                  "kernel_is_the_twin": GDNLinearAttentionBackend().conv1d_gdn_kernel() is twin_gdn.fused_conv1d_gdn}))
