"""Graphs a stock server reaches that tpu-inference's own warm-up skips (prompt logprobs above 1024 tokens):
planned as beyond-warm-up, compiled by the build, hit by verify, and by the stock `vllm serve` under a
long prompt that asks for prompt logprobs: nothing compiles after ready."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from aotc.runners.tpu_inference.plan import buckets
from aotc.testing import stock_server

from .conftest import REPO, stack_method_source
from .test_build_verify_jax import aotc

CONFIG = REPO / "configs" / "long-prompts-jax.yaml"
ENTRY = load_matrix(CONFIG, check_stack=False).entries[0]
PLAN = plan_entry(ENTRY)
BEYOND = [g for g in PLAN.graphs if g.beyond_warmup]


def test_plan_lists_the_prompt_logprob_buckets_the_warmup_skips():
    tokens = PLAN.buckets["token_paddings"]
    assert [g.shape_dict["num_tokens"] for g in BEYOND] == [t for t in tokens if t > buckets.MAX_PRECOMPILE_PROMPT_TOKENS]
    assert BEYOND and all(g.family == "gather_prompt_logprobs" for g in BEYOND)


def test_the_limit_is_tpu_inferences_own(jax_env):
    source = stack_method_source(jax_env, "tpu_inference.runner.compilation_manager", "CompilationManager",
                                 "_precompile_gather_logprobs")
    assert int(re.search(r"MAX_PRECOMPILE_PROMPT_TOKENS = (\d+)", source)[1]) == buckets.MAX_PRECOMPILE_PROMPT_TOKENS


@pytest.fixture(scope="module")
def artifact(jax_env, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("long-prompts")
    proc = aotc(jax_env, "build", CONFIG, "--out", out, "--traffic", "8", "--json", timeout=2400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    built = json.loads(proc.stdout)["entries"][0]
    assert built["graphs_with_keys"] == built["planned"] == len(PLAN.graphs)
    return out / ENTRY.name


@pytest.mark.slow
def test_beyond_warmup_graphs_are_built_verified_and_served(jax_env, artifact, tmp_path):
    manifest = json.loads((artifact / "manifest.json").read_text())
    recorded = [g for g in manifest["graphs"] if g.get("beyond_warmup")]
    assert [g["shape"] for g in recorded] == [g.shape_dict for g in BEYOND] and all(g["keys"] for g in recorded)

    proc = aotc(jax_env, "verify", artifact, "--traffic", "8", "--json", timeout=2400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout)["misses"] == 0

    # what a pod's fetch lays down: the artifact's cache files and its manifest, in a dir of their own
    cache = shutil.copytree(artifact / "cache", tmp_path / "cache")
    shutil.copy(artifact / "manifest.json", cache)
    server = stock_server.start(ENTRY, cache, tmp_path / "server.log", "strict", jax_env)
    try:
        server.wait_ready()
        longest = max(g.shape_dict["num_tokens"] for g in BEYOND)
        prompt = [(7 * i) % 500 + 3 for i in range(longest + 40)]  # a first chunk of the full budget
        status, body = stock_server.complete(server, prompt, max_tokens=2, prompt_logprobs=1)
        assert status == 200, body
        assert len(body["choices"][0]["prompt_logprobs"]) == len(prompt)
        after = stock_server.metrics(server)
        assert stock_server.samples(after, "aotc_compiles_after_ready_total") == {}
    finally:
        server.stop()
