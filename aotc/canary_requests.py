"""What users send a stock ``vllm serve``, as named request kinds for the canary (aotc/canary.py),
and the request options a stock server cannot serve for an entry (``unserved_options``).

Each kind is plain data: a name, the OpenAI endpoint, the request options it exercises and a body builder
sized from the entry's limits (max_model_len, max_num_batched_tokens, max_num_seqs, the model's vocabulary,
the adapters served). Bodies are seeded, so one entry always gets the same requests. Every prompt is a list
of token ids (its length is exact) and leaves room for the request's output within max_model_len; the chat
kind's text is short enough for any tokenizer whose tokens are at least a byte.

A kind that needs what the entry lacks (LoRA adapters, speculative decoding, a prompt longer than the token
budget) is not sent and says why; a kind the stack refuses (HTTP 400 with the stack's message, e.g. a
per-request seed on TPU) is the stack's limitation, counted apart from the requests it served.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aotc.entry import Entry, hf_config

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
# Output tokens per request: enough for a decode step of every kind, few enough to keep the canary short.
MAX_TOKENS = 8
# Ids below this are special (pad, bos, eos) in most vocabularies; prompts avoid them.
FIRST_PLAIN_ID = 3
# A vocabulary to draw ids from when the model's config is not local: byte-level tokenizers hold 256 ids.
FALLBACK_VOCAB = 256
# A chat template's own words around a message (role names, separators), in tokens, at most.
CHAT_TEMPLATE_ROOM = 32
CHAT_WORDS = ("the", "cache", "is", "warm", "and", "the", "pod", "serves", "what", "users", "send")

JSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "replicas": {"type": "integer"},
                   "ready": {"type": "boolean"}},
    "required": ["name", "replicas"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{1,6}( [a-z]{1,6}){0,2}"
CHOICES = ["yes", "no", "maybe"]


@dataclass(frozen=True)
class RequestLimits:
    """What bounds a request to this entry's server."""

    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    vocab: int
    lora_names: tuple[str, ...] = ()
    speculative: bool = False
    data_parallel_size: int = 1
    images: tuple[tuple[int, int, int], ...] = ()
    """(height, width, image tokens) the runner's plan covers (``Planner.traffic_images``); () text only."""
    images_per_prompt: int = 1
    """vLLM's ``limit_mm_per_prompt`` for images (its default: one)."""

    @classmethod
    def of(cls, entry, lora_names: tuple[str, ...] = (),
           images: tuple[tuple[int, int, int], ...] = ()) -> RequestLimits:
        """From a matrix Entry; the vocabulary from the model's local config.json when it has one."""
        engine = {key.replace("-", "_"): value for key, value in entry.engine.items()}
        vocab = FALLBACK_VOCAB
        if entry.model_config_path is not None:
            vocab = int(json.loads(entry.model_config_path.read_text()).get("vocab_size") or FALLBACK_VOCAB)
        return cls(entry.max_model_len, entry.max_num_batched_tokens, entry.max_num_seqs, vocab,
                   tuple(lora_names), bool(engine.get("speculative_config")),
                   int(engine.get("data_parallel_size") or 1), tuple(images),
                   int((engine.get("limit_mm_per_prompt") or {}).get("image", 1)))

    @property
    def longest_prompt(self) -> int:
        """The most prompt tokens a request with MAX_TOKENS of output may carry."""
        return self.max_model_len - MAX_TOKENS

    @property
    def short_prompt(self) -> int:
        return max(1, min(16, self.longest_prompt))


@dataclass(frozen=True)
class Kind:
    name: str
    endpoint: str
    options: tuple[str, ...]
    """The request options this kind exercises (RunnerSpec.unserved names options)."""
    build: Callable[[RequestLimits, random.Random], list[dict[str, Any]]]
    """Bodies without ``model`` unless the kind names one (LoRA)."""
    needs: Callable[[RequestLimits], str | None] = lambda limits: None
    """Why this entry cannot take the kind (None: it can)."""
    first_alone: bool = False
    """Send the first body to completion before the others (they reuse what it left in the cache)."""
    one_structured_at_a_time: bool = False
    """Never in flight together with another such request: tpu-inference 0.32 maps the grammar bitmask's rows
    to a step's structured-output requests in sorted-id order (StructuredDecodingManager.
    prepare_structured_decoding_input) while vLLM orders them as scheduled, so two in one step may get each
    other's mask and the grammar then terminates the request. One at a time still reaches the one
    structured-decoding graph per request padding a mixed batch uses."""


def tokens(rng: random.Random, limits: RequestLimits, length: int) -> list[int]:
    return [rng.randrange(FIRST_PLAIN_ID, limits.vocab) for _ in range(length)]


def prompt(rng: random.Random, limits: RequestLimits, **options: Any) -> dict[str, Any]:
    return {"prompt": tokens(rng, limits, limits.short_prompt), "max_tokens": MAX_TOKENS, **options}


def plain_ids(rng: random.Random, limits: RequestLimits, count: int) -> list[int]:
    return rng.sample(range(FIRST_PLAIN_ID, limits.vocab), min(count, limits.vocab - FIRST_PLAIN_ID))


def _sampling(limits, rng):
    return [prompt(rng, limits, temperature=0.9),
            prompt(rng, limits, temperature=0.8, top_p=0.9),
            prompt(rng, limits, temperature=0.7, top_k=20),
            prompt(rng, limits, temperature=1.0, min_p=0.05),
            prompt(rng, limits, temperature=0.8, top_p=0.95, top_k=50, min_p=0.02)]


def _penalties(limits, rng):
    return [prompt(rng, limits, temperature=0.0, presence_penalty=0.5),
            prompt(rng, limits, temperature=0.8, frequency_penalty=0.7),
            prompt(rng, limits, temperature=0.0, repetition_penalty=1.3),
            prompt(rng, limits, temperature=0.7, presence_penalty=-0.5, frequency_penalty=0.3, repetition_penalty=1.1)]


def _logit_bias(limits, rng):
    up, down = plain_ids(rng, limits, 4)[:2], plain_ids(rng, limits, 4)[2:]
    bias = {**{str(i): 5.0 for i in up}, **{str(i): -100.0 for i in down}}
    return [prompt(rng, limits, temperature=t, logit_bias=bias) for t in (0.0, 0.8)]


def _chat(limits, rng):
    room = max(1, min(len(" ".join(CHAT_WORDS)), limits.longest_prompt - CHAT_TEMPLATE_ROOM))
    words = []
    while len(" ".join([*words, "x"])) <= room and len(words) < 16:
        words.append(rng.choice(CHAT_WORDS))
    messages = [{"role": "user", "content": " ".join(words) or "hi"}]
    body = {"messages": messages, "max_completion_tokens": MAX_TOKENS}
    return [{**body, "temperature": 0.0}, {**body, "temperature": 0.8, "top_p": 0.9},
            {**body, "temperature": 0.0, "stream": True}]


def _chunked_prefill(limits, rng):
    return [{"prompt": tokens(rng, limits, limits.longest_prompt), "max_tokens": MAX_TOKENS, "temperature": t}
            for t in (0.0, 0.8)]


def _needs_chunking(limits: RequestLimits) -> str | None:
    if limits.longest_prompt <= limits.max_num_batched_tokens:
        return (f"no prompt within max_model_len {limits.max_model_len} exceeds max_num_batched_tokens "
                f"{limits.max_num_batched_tokens}: nothing is chunked")
    return None


def _shared_prefix(limits, rng):
    """One prompt, then a few more with the same prefix and their own last tokens: the prefix cache serves
    the shared part (the longer it is, the more whole KV blocks it fills)."""
    suffix = max(1, min(8, limits.longest_prompt // 4))
    prefix = tokens(rng, limits, max(1, limits.longest_prompt - suffix))
    return [{"prompt": prefix + tokens(rng, limits, suffix), "max_tokens": MAX_TOKENS, "temperature": 0.0}
            for _ in range(max(2, min(4, limits.max_num_seqs)))]


def _lora(limits, rng):
    return [{**prompt(rng, limits, temperature=t), "model": name}
            for name in limits.lora_names for t in (0.0, 0.8)]


def _speculative(limits, rng):
    """Prompts that repeat a phrase, so an n-gram proposer finds drafts (and a draft model has them to take)."""
    phrase = tokens(rng, limits, 4)
    length = min(limits.longest_prompt - MAX_TOKENS, limits.max_num_batched_tokens)
    repeated = (phrase * (1 + length // len(phrase)))[:max(1, length)]
    return [{"prompt": repeated, "max_tokens": 2 * MAX_TOKENS, "temperature": t} for t in (0.0, 0.0, 0.8)]


def _needs(attribute: str, what: str) -> Callable[[RequestLimits], str | None]:
    return lambda limits: None if getattr(limits, attribute) else f"the entry has no {what}"


def png_data_url(height: int, width: int, rng: random.Random, noise: bool) -> str:
    """A solid or noise RGB PNG as a data URL (Pillow, which vLLM's image loading needs anyway)."""
    import base64
    import io

    from PIL import Image

    if noise:
        image = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
    else:
        image = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _images(limits, rng):
    """Chat turns: each planned image size alone (solid, then noise), two images in one message where the
    limit allows, and text-only turns in the same wave."""
    pictures = [[png_data_url(h, w, rng, noise)] for h, w, _ in limits.images for noise in (False, True)]
    if len(limits.images) > 1 and limits.images_per_prompt > 1:
        pictures.append([png_data_url(h, w, rng, True) for h, w, _ in limits.images[:2]])
    contents = [[{"type": "text", "text": "what is in the picture"},
                 *({"type": "image_url", "image_url": {"url": url}} for url in urls)] for urls in pictures]
    contents += [[{"type": "text", "text": "and without a picture"}]] * max(1, len(pictures) // 2)
    return [{"messages": [{"role": "user", "content": content}], "max_tokens": MAX_TOKENS,
             "temperature": 0.0 if k % 2 else 0.8} for k, content in enumerate(contents)]


def _one_dp_rank(limits: RequestLimits) -> str | None:
    # tpu-inference's DP scheduler pickles each request to its rank; a structured-output request's grammar
    # (it holds a lock) cannot be, so it fails there (docs/design.md, "Plan").
    if limits.data_parallel_size > 1:
        return f"structured outputs are not served at data_parallel_size {limits.data_parallel_size} on this stack"
    return None


KINDS: tuple[Kind, ...] = (
    Kind("greedy", COMPLETIONS, ("temperature",), lambda l, r: [prompt(r, l, temperature=0.0) for _ in range(2)]),
    Kind("sampling", COMPLETIONS, ("temperature", "top_p", "top_k", "min_p"), _sampling),
    Kind("penalties", COMPLETIONS, ("presence_penalty", "frequency_penalty", "repetition_penalty"), _penalties),
    # n > 1 needs random sampling (vLLM refuses it greedy)
    Kind("n", COMPLETIONS, ("n",), lambda l, r: [prompt(r, l, temperature=0.8, n=min(3, l.max_num_seqs)),
                                                 prompt(r, l, temperature=1.0, top_k=20, n=2)]),
    Kind("logprobs", COMPLETIONS, ("logprobs",), lambda l, r: [prompt(r, l, temperature=0.0, logprobs=1),
                                                               prompt(r, l, temperature=0.8, top_k=50, logprobs=5)]),
    Kind("prompt_logprobs", COMPLETIONS, ("prompt_logprobs",),
         lambda l, r: [prompt(r, l, temperature=0.0, prompt_logprobs=1),
                       prompt(r, l, temperature=0.8, prompt_logprobs=3)]),
    Kind("logit_bias", COMPLETIONS, ("logit_bias",), _logit_bias),
    Kind("min_tokens", COMPLETIONS, ("min_tokens", "ignore_eos"),
         lambda l, r: [prompt(r, l, temperature=0.8, min_tokens=MAX_TOKENS // 2),
                       prompt(r, l, temperature=0.0, min_tokens=MAX_TOKENS, ignore_eos=True)]),
    Kind("stop", COMPLETIONS, ("stop", "stop_token_ids"),
         lambda l, r: [prompt(r, l, temperature=0.0, stop=["e", "\n"]),
                       prompt(r, l, temperature=0.8, stop_token_ids=plain_ids(r, l, 8)),
                       prompt(r, l, temperature=0.0, max_tokens=1)]),
    Kind("bad_words", COMPLETIONS, ("bad_words",),
         lambda l, r: [prompt(r, l, temperature=0.8, bad_words=["the", "cache", "a b"])]),
    Kind("echo", COMPLETIONS, ("echo",), lambda l, r: [prompt(r, l, temperature=0.0, echo=True)]),
    Kind("stream", COMPLETIONS, ("stream",),
         lambda l, r: [prompt(r, l, temperature=0.0, stream=True),
                       prompt(r, l, temperature=0.8, stream=True, stream_options={"include_usage": True})]),
    Kind("structured_choice", COMPLETIONS, ("structured_outputs",),
         lambda l, r: [prompt(r, l, temperature=0.8, structured_outputs={"choice": CHOICES})], _one_dp_rank, one_structured_at_a_time=True),
    Kind("structured_regex", COMPLETIONS, ("structured_outputs",),
         lambda l, r: [prompt(r, l, temperature=0.8, structured_outputs={"regex": REGEX})], _one_dp_rank, one_structured_at_a_time=True),
    Kind("structured_json", COMPLETIONS, ("response_format",),
         lambda l, r: [prompt(r, l, temperature=0.8, max_tokens=2 * MAX_TOKENS, response_format={
             "type": "json_schema", "json_schema": {"name": "deployment", "schema": JSON_SCHEMA}})], _one_dp_rank, one_structured_at_a_time=True),
    Kind("chat", CHAT, ("messages",), _chat),
    Kind("chunked_prefill", COMPLETIONS, ("prompt",), _chunked_prefill, _needs_chunking),
    Kind("shared_prefix", COMPLETIONS, ("prompt",), _shared_prefix, first_alone=True),
    Kind("seed", COMPLETIONS, ("seed",), lambda l, r: [prompt(r, l, temperature=0.8, seed=1234)]),
    Kind("lora", COMPLETIONS, ("model",), _lora, _needs("lora_names", "LoRA adapters")),
    Kind("speculative", COMPLETIONS, ("prompt",), _speculative, _needs("speculative", "speculative decoding")),
    Kind("images", CHAT, ("messages",), _images, _needs("images", "image inputs")),
)


@dataclass(frozen=True)
class Planned:
    kind: Kind
    bodies: tuple[dict[str, Any], ...]
    not_sent: str | None = None
    """Why the kind is not sent to this entry's server (the entry lacks what it needs, or the stack cannot
    serve one of its options)."""


def plan_requests(limits: RequestLimits, seed: int = 0, unserved: dict[str, str] | None = None,
                  kinds: tuple[Kind, ...] = KINDS) -> list[Planned]:
    """Every kind with its bodies for this entry; each kind draws from its own seeded stream, so adding a
    kind changes no other's requests."""
    planned = []
    unserved = unserved or {}
    for kind in kinds:
        why = kind.needs(limits) or next((f"{option} not requested: {unserved[option]}"
                                         for option in kind.options if option in unserved), None)
        bodies = () if why else tuple(kind.build(limits, random.Random(f"{seed}:{kind.name}")))
        planned.append(Planned(kind, bodies, why))
    return planned


# With speculative decoding: what vLLM's front end refuses (HTTP 400: "The min_p and logit_bias sampling
# parameters are not yet supported with speculative decoding"), and sampled-token logprobs, which at times carry a
# negative token id that kills the API server's output handler (every request in flight fails with HTTP 500),
# and what tpu-inference's runner cannot do with draft tokens and raises on inside the engine core (the server
# dies): prompt logprobs, and a structured-output bitmask (one row per request) against the logits (one row per
# draft token too).
SPECULATIVE_UNSERVED = {
    "min_p": "vLLM refuses min_p with speculative decoding",
    "logprobs": "with speculative decoding the stack's logprobs at times hold a negative token id, and the API "
                "server's output handler dies detokenizing it (OverflowError; every request in flight fails)",
    "prompt_logprobs": "tpu-inference 0.32 raises 'prompt_logprobs is not supported with speculative decoding' in "
                       "the engine core's step (TPUModelRunner._execute_model), which kills the server",
    **dict.fromkeys(("structured_outputs", "response_format"),
                    "tpu-inference 0.32 applies the grammar bitmask (a row per request) to logits with a row per "
                    "draft token too (StructuredDecodingManager: incompatible shapes), which kills the server"),
}


def unserved_options(entry: Entry) -> dict[str, str]:
    """Request options the stock server cannot serve for this entry: the stack's (RunnerSpec.unserved), and
    with speculative decoding vLLM's own refusals, with images the stack's multimodal ones."""
    unserved = dict(entry.backend.unserved)
    if entry.engine.get("speculative_config"):
        unserved.update(SPECULATIVE_UNSERVED)
    if entry.backend.planner.traffic_images(entry, hf_config(entry)):
        unserved.update(entry.backend.unserved_with_images)
    return unserved
