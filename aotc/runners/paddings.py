"""Padding rules both TPU stacks share (vLLM 0.13's runner and tpu-inference's runner.utils use the same
token bucketing); each runner's tests check them against its own upstream helpers."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def next_power_of_2(n: int) -> int:
    return 1 if n < 1 else 1 << (n - 1).bit_length()


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
