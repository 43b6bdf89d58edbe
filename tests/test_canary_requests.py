"""The canary's request kinds (aotc/canary_requests.py): every kind is there, every body stays within the
entry's limits and is a request vLLM's own OpenAI protocol accepts; the structured-output constraints compile
in xgrammar (the backend vLLM picks for them). No server here: the slow canary tests send them."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from aotc.canary_send import error_message, stream_problem
from aotc.canary_requests import (CHAT, CHOICES, COMPLETIONS, FIRST_PLAIN_ID, JSON_SCHEMA, KINDS, REGEX,
                                  RequestLimits, _images, plan_requests)
from aotc.matrix import load_matrix

from .conftest import CONFIGS

# Entries as limits only: the JAX stack's check of their engine args is the tpu-inference tests' (needs_jax).
DEMO = load_matrix(CONFIGS / "demo-jax.yaml", check_stack=False).entries[0]
FEATURES = load_matrix(CONFIGS / "features-jax.yaml", check_stack=False).entries
NGRAM = next(e for e in FEATURES if e.name.startswith("ngram"))
DP2 = next(e for e in FEATURES if e.name.startswith("dp2"))
# Shapes a real matrix uses besides the demo's: a long context with a large budget, and a tight one.
LIMITS = [
    RequestLimits.of(DEMO),
    RequestLimits(4096, 512, 64, 151936, ("a", "b"), speculative=True, images=((28, 28, 1),)),
    RequestLimits(2048, 2048, 256, 32000),
    RequestLimits(40, 16, 2, 512, ("only",)),
]


def bodies(limits: RequestLimits, seed: int = 0):
    return [(p.kind, body) for p in plan_requests(limits, seed) for body in p.bodies]


def test_every_kind_users_send_is_planned_once():
    names = [kind.name for kind in KINDS]
    assert len(names) == len(set(names))
    assert {"penalties", "n", "prompt_logprobs", "logprobs", "logit_bias", "min_tokens", "stop", "bad_words", "echo",
            "stream", "structured_choice", "structured_regex", "structured_json", "chat", "chunked_prefill",
            "shared_prefix", "seed", "lora", "speculative", "images"} <= set(names)
    everything = RequestLimits(4096, 512, 64, 32000, ("a",), speculative=True, images=((28, 28, 1), (56, 42, 3)),
                               images_per_prompt=2)
    planned = plan_requests(everything)
    assert [p.kind.name for p in planned] == names and all(p.bodies and p.not_sent is None for p in planned)


def test_kinds_an_entry_cannot_take_are_not_sent_and_say_why():
    demo = {p.kind.name: p for p in plan_requests(RequestLimits.of(DEMO))}
    assert demo["lora"].not_sent == "the entry has no LoRA adapters" and not demo["lora"].bodies
    assert demo["speculative"].not_sent == "the entry has no speculative decoding"
    assert demo["chunked_prefill"].not_sent is None  # the demo's 128 > 64 token budget: chunked
    assert demo["images"].not_sent == "the entry has no image inputs"
    assert {p.kind.name for p in plan_requests(RequestLimits.of(NGRAM)) if p.not_sent} == {"lora", "images"}
    dp2 = {p.kind.name for p in plan_requests(RequestLimits.of(DP2)) if p.not_sent}
    assert {"structured_choice", "structured_regex", "structured_json"} <= dp2
    unchunked = {p.kind.name: p for p in plan_requests(RequestLimits(2048, 2048, 8, 512))}
    assert "nothing is chunked" in unchunked["chunked_prefill"].not_sent


def test_an_unserved_option_keeps_its_kinds_out_with_the_stacks_reason():
    planned = {p.kind.name: p for p in plan_requests(RequestLimits.of(DEMO), unserved={"logprobs": "it hangs"})}
    assert planned["logprobs"].not_sent == "logprobs not requested: it hangs" and not planned["logprobs"].bodies
    assert planned["prompt_logprobs"].bodies  # its own option, not `logprobs`


@pytest.mark.parametrize("limits", LIMITS, ids=lambda l: f"len{l.max_model_len}-tok{l.max_num_batched_tokens}")
def test_every_body_stays_within_the_entrys_limits(limits):
    for kind, body in bodies(limits):
        assert "model" not in body or body["model"] in limits.lora_names, kind.name
        assert body.get("n", 1) <= limits.max_num_seqs, kind.name
        if kind.endpoint == COMPLETIONS:
            prompt = body["prompt"]
            assert all(FIRST_PLAIN_ID <= t < limits.vocab for t in prompt), kind.name
            assert 1 <= len(prompt) and len(prompt) + body["max_tokens"] <= limits.max_model_len, kind.name
        for ids in (body.get("stop_token_ids") or [], map(int, body.get("logit_bias") or {})):
            assert all(FIRST_PLAIN_ID <= t < limits.vocab for t in ids), kind.name


@pytest.mark.parametrize("limits", LIMITS, ids=lambda l: f"len{l.max_model_len}-tok{l.max_num_batched_tokens}")
def test_long_prompts_are_chunked_and_shared_prefixes_are_shared(limits):
    planned = {p.kind.name: p for p in plan_requests(limits)}
    if planned["chunked_prefill"].bodies:
        assert all(len(b["prompt"]) > limits.max_num_batched_tokens for b in planned["chunked_prefill"].bodies)
    shared = [b["prompt"] for b in planned["shared_prefix"].bodies]
    prefix = len(shared[0]) - min(8, limits.longest_prompt // 4)
    assert len(shared) >= 2 and len({tuple(p[:prefix]) for p in shared}) == 1 and len({tuple(p) for p in shared}) > 1
    assert planned["shared_prefix"].kind.first_alone


def test_bodies_are_seeded_and_never_depend_on_anything_else():
    limits = RequestLimits.of(DEMO)
    assert bodies(limits, 3) == bodies(limits, 3)
    assert bodies(limits, 3) != bodies(limits, 4)


def test_every_body_is_a_request_vllms_openai_protocol_accepts():
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

    protocol = {COMPLETIONS: CompletionRequest, CHAT: ChatCompletionRequest}
    for kind, body in bodies(LIMITS[1]) + bodies(RequestLimits.of(DEMO)):
        request = protocol[kind.endpoint].model_validate({"model": "m", **body})
        # vLLM's own checks of the sampling parameters (e.g. n > 1 only with random sampling)
        request.to_sampling_params(body.get("max_tokens") or body["max_completion_tokens"], None, {})


def test_each_kind_sends_the_options_it_names():
    for p in plan_requests(LIMITS[1]):
        sent = {option for body in p.bodies for option in body}
        assert set(p.kind.options) <= sent, p.kind.name


def test_the_structured_output_constraints_are_valid_and_compile_in_xgrammar():
    import xgrammar

    jsonschema.Draft202012Validator.check_schema(JSON_SCHEMA)
    jsonschema.validate({"name": "pod", "replicas": 2}, JSON_SCHEMA)
    assert re.fullmatch(REGEX, "warm pod") and not re.fullmatch(REGEX, "Warm")
    xgrammar.Grammar.from_json_schema(json.dumps(JSON_SCHEMA))
    xgrammar.Grammar.from_regex(REGEX)
    assert len(set(CHOICES)) == len(CHOICES) > 1


def test_a_stream_must_end_with_done_and_carry_no_error_event():
    ok = 'data: {"choices": [{"text": "a"}]}\n\ndata: [DONE]\n\n'
    assert stream_problem(ok) is None
    assert "without [DONE]" in stream_problem('data: {"choices": [{"text": "a"}]}\n\n')
    failed = 'data: {"error": {"message": "engine died", "code": 500}}\n\ndata: [DONE]\n\n'
    assert stream_problem(failed) == "error event: engine died"


def test_the_stacks_refusal_message_is_read_from_either_error_shape():
    assert error_message(b'{"error": {"message": "JAX does not support per-request seed."}}') == \
        "JAX does not support per-request seed."
    assert error_message(b'{"object": "error", "message": "no seed", "code": 400}') == "no seed"
    assert error_message(b"plain") == "plain"


def test_image_turns_carry_each_planned_size_and_two_in_one_where_the_limit_allows():
    import base64
    import io

    from PIL import Image

    sizes = ((28, 56, 2), (56, 28, 2))
    bodies = _images(RequestLimits(512, 64, 8, 512, images=sizes, images_per_prompt=2), random.Random(0))
    pictures = [[part["image_url"]["url"] for part in b["messages"][0]["content"] if part["type"] == "image_url"]
                for b in bodies]
    decoded = [[Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).size for url in urls]
               for urls in pictures]
    assert decoded[:4] == [[(56, 28)], [(56, 28)], [(28, 56)], [(28, 56)]]  # (width, height), solid and noise
    assert [(56, 28), (28, 56)] in decoded and [] in decoded  # two in one message; a text-only turn
    one_each = _images(RequestLimits(512, 64, 8, 512, images=sizes), random.Random(0))
    assert max(len(b["messages"][0]["content"]) for b in one_each) == 2  # the text and one image
