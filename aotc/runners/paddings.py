"""Padding rules both TPU stacks share (vLLM 0.13's runner and tpu-inference's runner.utils use the same
token bucketing); each runner's tests check them against its own upstream helpers."""

from __future__ import annotations

MIN_NUM_SEQS = 8  # the smallest request bucket in both runners


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def next_power_of_2(n: int) -> int:
    return 1 if n < 1 else 1 << (n - 1).bit_length()


def page_size(max_model_len: int) -> int:
    """PallasAttentionBackend.get_page_size (both stacks): the KV block size when the config names none;
    vLLM 0.13's TpuPlatform overrides any configured block_size with it."""
    if max_model_len > 8192:
        return 16
    return min(max(next_power_of_2(max_model_len) // 16, 16), 256)


def token_paddings(min_token_size: int, max_token_size: int, padding_gap: int) -> list[int]:
    """Doubling buckets up to ``max_token_size``, or doubling up to the gap and then linear."""
    paddings = []
    num = min_token_size
    if padding_gap == 0:
        while True:
            paddings.append(num)
            if num >= max_token_size:
                return paddings
            num *= 2
    while num <= padding_gap:
        paddings.append(num)
        num *= 2
    num //= 2
    while num < max_token_size:
        num += padding_gap
        paddings.append(num)
    return paddings


def padded_num_reqs_with_upper_limit(x: int, upper_limit: int) -> int:
    res = MIN_NUM_SEQS if x <= MIN_NUM_SEQS else 1 << (x - 1).bit_length()
    return min(res, upper_limit)


def req_paddings(min_req_size: int, max_req_size: int) -> list[int]:
    paddings: list[int] = []
    num = max(MIN_NUM_SEQS, min_req_size)
    while num <= max_req_size and (not paddings or paddings[-1] != num):
        paddings.append(num)
        num = padded_num_reqs_with_upper_limit(num + 1, max_req_size)
    return paddings


def full_length_blocks(max_num_seqs: int, max_model_len: int, block_size: int) -> int:
    """KV blocks of ``block_size`` tokens for every sequence at full length, +1 for the null block vLLM reserves."""
    return max_num_seqs * cdiv(max_model_len, block_size) + 1
