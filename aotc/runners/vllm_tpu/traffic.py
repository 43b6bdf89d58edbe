"""Seeded request traffic through the real engine.

capture_model does not compile everything a live server hits: e.g. a batch
mixing greedy and random requests has `all_greedy=False, all_random=False`,
a sampler variant capture never traces. The sweep therefore opens with a
coverage set (every request bucket × greedy+random mix × logprobs, plus a
request count between buckets) and then adds random batches: sizes up to
max_num_seqs, prompts up to max_model_len minus room for output, temperature,
top_p, top_k, min_p and logprobs drawn per request.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

MIN_NUM_SEQS = 8  # vLLM TPU runner's smallest request bucket
MAX_NEW_TOKENS = 12


@dataclasses.dataclass
class Request:
    prompt: list[int]
    sampling: dict[str, Any]


def request_buckets(max_num_seqs: int) -> list[int]:
    from vllm.v1.worker.tpu_model_runner import _get_req_paddings

    return _get_req_paddings(MIN_NUM_SEQS, max(max_num_seqs, MIN_NUM_SEQS))


def _sampling(rng: random.Random, greedy: bool, logprobs: bool) -> dict[str, Any]:
    params: dict[str, Any] = {
        "max_tokens": rng.randint(2, MAX_NEW_TOKENS),
        # Dummy weights emit EOS at random; fixed lengths keep steps comparable.
        "ignore_eos": True,
        "detokenize": False,
        "logprobs": rng.randint(1, 5) if logprobs else None,
    }
    if greedy:
        params["temperature"] = 0.0
    else:
        params.update(
            temperature=round(rng.uniform(0.3, 1.5), 3),
            top_p=rng.choice([1.0, 0.9, 0.5]),
            top_k=rng.choice([0, 5, 50]),
            min_p=rng.choice([0.0, 0.1]),
        )
    return params


def _prompt(rng: random.Random, vocab: int, max_len: int) -> list[int]:
    # Ids 0..2 are pad/bos/eos in the demo config; avoid special handling.
    return [rng.randrange(3, vocab) for _ in range(rng.randint(1, max(1, max_len)))]


def _batch(rng, size, vocab, max_prompt, greedy_of, logprobs_of) -> list[Request]:
    return [
        Request(_prompt(rng, vocab, max_prompt), _sampling(rng, greedy_of(i), logprobs_of(i)))
        for i in range(size)
    ]


def coverage_batches(rng: random.Random, limits: dict[str, int], vocab: int) -> list[list[Request]]:
    """Batches that reach each request bucket with mixed sampling, ± logprobs."""
    max_seqs = limits["max_num_seqs"]
    batches = []
    sizes = sorted({min(b, max_seqs) for b in request_buckets(max_seqs)} | {max(1, min(3, max_seqs))})
    for size in sizes:
        # Short prompts so the whole batch is scheduled together.
        max_prompt = max(1, limits["max_num_batched_tokens"] // size - 1)
        for logprobs in (False, True):
            batches.append(_batch(rng, size, vocab, max_prompt, lambda i: i % 2 == 0, lambda i: logprobs and i == 0))
    return batches


def random_batch(rng: random.Random, limits: dict[str, int], vocab: int) -> list[Request]:
    size = rng.randint(1, limits["max_num_seqs"])
    max_prompt = limits["max_model_len"] - MAX_NEW_TOKENS - 1
    greedy = [rng.random() < 0.4 for _ in range(size)]
    logprobs = [rng.random() < 0.3 for _ in range(size)]
    return _batch(rng, size, vocab, max_prompt, greedy.__getitem__, logprobs.__getitem__)


def plan_traffic(seed: int, requests: int, limits: dict[str, int], vocab: int) -> list[list[Request]]:
    rng = random.Random(seed)
    batches = coverage_batches(rng, limits, vocab)
    while sum(map(len, batches)) < requests:
        batches.append(random_batch(rng, limits, vocab))
    return batches


def run_traffic(llm, batches: list[list[Request]]) -> int:
    from vllm import SamplingParams

    sent = 0
    for batch in batches:
        prompts = [{"prompt_token_ids": r.prompt} for r in batch]
        params = [SamplingParams(**r.sampling) for r in batch]
        llm.generate(prompts, params, use_tqdm=False)
        sent += len(batch)
    return sent
