"""Seeded request traffic through a real in-process vLLM engine; backend-neutral.

A runner's warm-up does not compile everything a live server hits (e.g. a batch mixing greedy and
random requests, or logprobs on a sampled token), so build and verify both drive a sweep: a coverage
set (every request bucket × greedy+random mix × logprobs, plus a request count between buckets), then
random batches — sizes up to max_num_seqs, prompts up to max_model_len minus room for output,
temperature, top_p, top_k, min_p and logprobs drawn per request — then, for a runner that names its token
buckets, the step grid: one scheduler step at every reachable request bucket × token bucket pair,
± prompt logprobs. The runner supplies its buckets; `prompt_logprobs` adds prompt-logprob requests for
backends that support them. An entry with ``enable_lora`` sends every batch with base-model requests and
requests naming each of ``max_loras`` adapters mixed (a random adapter, aotc/runners/lora.py), so the steps
run with LoRA active as a server's do. A runner that names image sizes (a vision-language model) adds image
batches: each size alone, then images of random sizes mixed with text prompts (solid and noise images made
here, placed after a random text prefix)."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import tempfile
from typing import Any

from aotc.entry import Entry

MAX_NEW_TOKENS = 12
# A step-grid batch needs its first step (the prefill) and one decode step; more tokens add nothing to it.
STEP_NEW_TOKENS = 2


@dataclasses.dataclass
class TrafficRequest:
    """One generation request of the sweep (not the runner protocol's ``Request``, the build or verify job)."""

    prompt: list[int]
    sampling: dict[str, Any]
    adapter: int = 0
    """0: the base model; k >= 1: the k-th LoRA adapter (its vLLM lora_int_id)."""
    images: tuple[tuple[int, int, int], ...] = ()
    """(height, width, seed) of each image; the prompt holds one image placeholder per image, in order."""


@dataclasses.dataclass(frozen=True)
class Limits:
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    request_buckets: tuple[int, ...]
    # Token buckets to reach with prompt-logprob requests (which run every prompt position through the
    # sampler head); empty: no prompt logprobs.
    prompt_logprob_buckets: tuple[int, ...] = ()
    # Token buckets of a runner whose per-step graphs (eager ops between its precompiled ones, e.g.
    # tpu-inference's jit_split and the prompt-logprob row select) are shaped by the padded request count
    # *and* the padded token count: the sweep then reaches every pair (step_shapes); empty: no grid.
    token_buckets: tuple[int, ...] = ()
    # LoRA adapters a step may hold at once (the entry's max_loras when enable_lora); 0: no LoRA.
    loras: int = 0
    # Image sizes to send, (height, width, tokens the image takes in the prompt); empty: text only.
    image_sizes: tuple[tuple[int, int, int], ...] = ()
    # The token ids that stand for one image in a prompt (the engine expands them to the image's tokens).
    image_placeholder: tuple[int, ...] = ()
    # Images one prompt may hold (vLLM's limit_mm_per_prompt).
    images_per_prompt: int = 1

    @property
    def prompt_logprobs(self) -> bool:
        return bool(self.prompt_logprob_buckets)

    @classmethod
    def of(cls, entry: Entry, request_buckets: list[int], prompt_logprob_buckets: list[int] = (),
           token_buckets: list[int] = ()) -> Limits:
        return cls(entry.max_model_len, entry.max_num_seqs, entry.max_num_batched_tokens,
                   tuple(request_buckets), tuple(prompt_logprob_buckets), tuple(token_buckets),
                   lora_slots(entry.engine))


def lora_slots(engine: dict[str, Any]) -> int:
    """How many adapters one step may hold: vLLM's max_loras (default 1) when LoRA is on, else 0."""
    engine = {key.replace("-", "_"): value for key, value in engine.items()}
    return int(engine.get("max_loras") or 1) if engine.get("enable_lora") else 0


def _sampling(rng: random.Random, greedy: bool, logprobs: bool, prompt_logprobs: bool) -> dict[str, Any]:
    params: dict[str, Any] = {
        "max_tokens": rng.randint(2, MAX_NEW_TOKENS),
        # Dummy weights emit EOS at random; fixed lengths keep steps comparable.
        "ignore_eos": True,
        "detokenize": False,
        "logprobs": rng.randint(1, 5) if logprobs else None,
    }
    if prompt_logprobs:
        params["prompt_logprobs"] = rng.randint(1, 3)
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


def _tokens(rng: random.Random, vocab: int, length: int) -> list[int]:
    # Ids 0..2 are pad/bos/eos in the demo config; avoid special handling.
    return [rng.randrange(3, vocab) for _ in range(length)]


def _prompt(rng: random.Random, vocab: int, max_len: int) -> list[int]:
    return _tokens(rng, vocab, rng.randint(1, max(1, max_len)))


def _batch(rng, size, vocab, max_prompt, greedy_of, logprobs_of,
           prompt_logprobs_of=lambda i: False) -> list[TrafficRequest]:
    return [
        TrafficRequest(_prompt(rng, vocab, max_prompt),
                       _sampling(rng, greedy_of(i), logprobs_of(i), prompt_logprobs_of(i)))
        for i in range(size)
    ]


def _image_request(rng: random.Random, limits: Limits, vocab: int, sizes: list[tuple[int, int, int]]) -> TrafficRequest:
    """A text prefix, the images' placeholders, a text suffix; the prompt and its images fit max_model_len."""
    room = limits.max_model_len - MAX_NEW_TOKENS - 1 - sum(tokens + len(limits.image_placeholder)
                                                           for _, _, tokens in sizes)
    prefix, suffix = rng.randint(0, max(0, room // 2)), rng.randint(1, max(1, room // 2))
    placeholders = [t for _ in sizes for t in limits.image_placeholder]
    prompt = _tokens(rng, vocab, prefix) + placeholders + _tokens(rng, vocab, suffix)
    return TrafficRequest(prompt, _sampling(rng, rng.random() < 0.5, rng.random() < 0.3, False),
                   images=tuple((h, w, rng.randrange(1 << 30)) for h, w, _ in sizes))


def _fitting(sizes: list[tuple[int, int, int]], limits: Limits) -> list[tuple[int, int, int]]:
    """The first of ``sizes`` whose tokens, with a token of text each side and the generated ones, fit
    max_model_len (at least one: a single image always fits, the runner sends no larger)."""
    kept, used = [], MAX_NEW_TOKENS + 3
    for size in sizes:
        used += size[2] + len(limits.image_placeholder)
        if kept and used > limits.max_model_len:
            break
        kept.append(size)
    return kept


def image_batches(rng: random.Random, limits: Limits, vocab: int) -> list[list[TrafficRequest]]:
    """Each image size alone; then full batches mixing text prompts with prompts of one or more images of
    random sizes."""
    if not limits.image_sizes:
        return []
    sizes = list(limits.image_sizes)
    batches = [[_image_request(rng, limits, vocab, [size])] for size in sizes]
    for _ in range(2):
        batch = []
        for i in range(limits.max_num_seqs):
            if i % 3 == 1:
                batch.append(TrafficRequest(_prompt(rng, vocab, limits.max_model_len // 2),
                                            _sampling(rng, True, False, False)))
                continue
            count = rng.randint(1, limits.images_per_prompt)
            drawn = [rng.choice(sizes) for _ in range(count)]
            batch.append(_image_request(rng, limits, vocab, _fitting(drawn, limits)))
        batches.append(batch)
    return batches


def made_image(height: int, width: int, seed: int):
    """A solid or a noise RGB image of the size (PIL)."""
    from PIL import Image

    rng = random.Random(seed)
    if seed % 2:
        return Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
    return Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))


def step_shapes(limits: Limits) -> list[tuple[int, int]]:
    """(requests, tokens) of one scheduler step per reachable (request bucket, token bucket) pair.

    A step of n requests and t tokens pads to the smallest buckets >= n and >= t; every request holds at
    least one of the step's tokens (t >= n), at most max_num_seqs run, t stays within the token budget and
    each prompt leaves room for its output. For each pair this takes the most requests the pair allows
    and as many tokens as the bucket, the budget and the prompts' room allow; a pair no step can pad to
    (e.g. every n that pads to the request bucket exceeds the token bucket) is absent."""
    shapes = []
    requests, tokens = sorted(set(limits.request_buckets)), sorted(set(limits.token_buckets))
    room = limits.max_model_len - STEP_NEW_TOKENS
    for below, bucket in zip([0, *requests], requests):
        fewest, most = below + 1, min(bucket, limits.max_num_seqs)
        for under, token_bucket in zip([0, *tokens], tokens):
            n = min(most, token_bucket)
            t = min(token_bucket, limits.max_num_batched_tokens, n * room)
            if n >= fewest and t > under and t >= n:
                shapes.append((n, t))
    return shapes


def _step_batch(rng: random.Random, requests: int, tokens: int, vocab: int,
                prompt_logprobs: bool) -> list[TrafficRequest]:
    """``requests`` fresh prompts of ``tokens`` tokens in all: the engine schedules them as one prefill step
    (within the budget, nothing else running), then one decode step."""
    lengths = [tokens // requests + (i < tokens % requests) for i in range(requests)]
    batch = []
    for i, length in enumerate(lengths):
        sampling = _sampling(rng, i % 2 == 0, False, prompt_logprobs and i == 0)
        sampling["max_tokens"] = STEP_NEW_TOKENS
        batch.append(TrafficRequest(_tokens(rng, vocab, length), sampling))
    return batch


def step_batches(rng: random.Random, limits: Limits, vocab: int) -> list[list[TrafficRequest]]:
    """One batch per step_shapes pair, and one more with a prompt-logprob request where supported."""
    return [_step_batch(rng, n, t, vocab, with_prompt_logprobs)
            for n, t in step_shapes(limits)
            for with_prompt_logprobs in (False, True)[:1 + limits.prompt_logprobs]]


def coverage_batches(rng: random.Random, limits: Limits, vocab: int) -> list[list[TrafficRequest]]:
    """Batches that reach each request bucket with mixed sampling, ± logprobs (± prompt logprobs)."""
    max_seqs = limits.max_num_seqs
    batches = []
    sizes = sorted({min(b, max_seqs) for b in limits.request_buckets} | {max(1, min(3, max_seqs))})
    for size in sizes:
        # Short prompts so the whole batch is scheduled together.
        max_prompt = max(1, limits.max_num_batched_tokens // size - 1)
        for logprobs in (False, True):
            batches.append(_batch(rng, size, vocab, max_prompt, lambda i: i % 2 == 0,
                                  lambda i: logprobs and i == 0,
                                  lambda i: logprobs and limits.prompt_logprobs and i == 1))
    longest = limits.max_model_len - MAX_NEW_TOKENS - 1
    for bucket in limits.prompt_logprob_buckets:
        prompt = _tokens(rng, vocab, max(1, min(bucket, longest)))
        batches.append([TrafficRequest(prompt, _sampling(rng, True, False, True))])
    return batches


def random_batch(rng: random.Random, limits: Limits, vocab: int) -> list[TrafficRequest]:
    size = rng.randint(1, limits.max_num_seqs)
    max_prompt = limits.max_model_len - MAX_NEW_TOKENS - 1
    greedy = [rng.random() < 0.4 for _ in range(size)]
    logprobs = [rng.random() < 0.3 for _ in range(size)]
    prompt_logprobs = [limits.prompt_logprobs and rng.random() < 0.1 for _ in range(size)]
    return _batch(rng, size, vocab, max_prompt, greedy.__getitem__, logprobs.__getitem__, prompt_logprobs.__getitem__)


def plan_traffic(seed: int, requests: int, limits: Limits, vocab: int) -> list[list[TrafficRequest]]:
    """The coverage set, random batches until ``requests`` requests in all, then the step grid (extra:
    its size follows from the buckets, so ``requests`` keeps buying the same random exploration)."""
    rng = random.Random(seed)
    batches = coverage_batches(rng, limits, vocab)
    while sum(map(len, batches)) < requests:
        batches.append(random_batch(rng, limits, vocab))
    return mix_adapters(batches + step_batches(rng, limits, vocab), limits.loras) + image_batches(rng, limits, vocab)


def mix_adapters(batches: list[list[TrafficRequest]], loras: int) -> list[list[TrafficRequest]]:
    """Request i of batch b names adapter (i + b) mod (loras + 1), 0 being the base model: each batch of
    two or more mixes base and adapter requests, and batches of one take each in turn. Draws nothing from
    the sweep's random stream, so an entry without LoRA gets the same traffic as before."""
    if loras:
        for b, batch in enumerate(batches):
            for i, request in enumerate(batch):
                request.adapter = (i + b) % (loras + 1)
    return batches


def run_traffic(llm, batches: list[list[TrafficRequest]]) -> int:
    from vllm import SamplingParams

    sent = 0
    with _adapters(llm, batches) as adapters:
        for batch in batches:
            prompts = [_engine_prompt(r) for r in batch]
            params = [SamplingParams(**r.sampling) for r in batch]
            loras = [adapters[r.adapter] for r in batch] if adapters else None
            llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
            sent += len(batch)
    return sent


def _engine_prompt(request: TrafficRequest) -> dict[str, Any]:
    prompt: dict[str, Any] = {"prompt_token_ids": request.prompt}
    if request.images:
        prompt["multi_modal_data"] = {"image": [made_image(h, w, seed) for h, w, seed in request.images]}
    return prompt


@contextlib.contextmanager
def _adapters(llm, batches: list[list[TrafficRequest]]):
    """index -> vLLM LoRARequest (None for the base model), one random adapter written for the engine's
    model and rank; {} when no request names one."""
    ids = sorted({r.adapter for batch in batches for r in batch} - {0})
    if not ids:
        yield {}
        return
    from vllm.lora.request import LoRARequest

    from aotc.runners.lora import ADAPTER_NAME, write_adapter

    engine = llm.llm_engine
    rank = min(8, engine.vllm_config.lora_config.max_lora_rank)
    with tempfile.TemporaryDirectory(prefix="aotc-lora-") as tmp:
        path = str(write_adapter(tmp, engine.model_config.hf_config.to_dict(), rank=rank))
        adapters = {k: LoRARequest(f"{ADAPTER_NAME}-{k}", k, path) for k in ids}
        # Loaded ahead of the traffic as a server loads --lora-modules and /v1/load_lora_adapter (the engine's
        # add_lora, outside any step: its weight moves compile graphs of their own); unloaded after it as
        # /v1/unload_lora_adapter does.
        for request in adapters.values():
            engine.add_lora(request)
        yield {0: None, **adapters}
        for k in adapters:
            engine.remove_lora(k)
