"""Engine features on the CPU twin, through the real CLI: speculative decoding (ngram, eagle3, MTP, Gemma 4's MTP
assistant, DFlash) and data parallel 2 (configs/features-jax.yaml) each build with every planned graph compiled, and
a fresh server's verify finds every graph it compiles in the artifact. Async scheduling off is served by the ngram
entry (ngram turns it off), whose plan holds every graph the async-off entry plans, so the suite builds it once.
Expected counts come from the plan (tests/tpu_inference/test_plan_jax.py ties it to tpu-inference's own
capture_model), never from a previous run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from aotc.runners.tpu_inference.plan import buckets
from tests.support_cases import FEATURES_JAX_BUILT

from .conftest import REPO
from .test_build_verify_jax import aotc

CONFIG = REPO / "configs" / "features-jax.yaml"
MATRIX = load_matrix(CONFIG, check_stack=False)
NGRAM, EAGLE3, MTP, GEMMA4_MTP, DFLASH, DP2, ASYNC_OFF = (
    f"{name}--len128-seqs8-tok64-tp1" for name in ("ngram", "eagle3", "mtp", "gemma4-mtp", "dflash", "dp2", "async-off"))
BUILT = tuple(f"{name}--len128-seqs8-tok64-tp1" for name in FEATURES_JAX_BUILT)  # as docs/support.md's table


@pytest.fixture(scope="module")
def built(jax_env, tmp_path_factory) -> dict[str, dict]:
    """One build of every entry but async-off (one engine process each), shared by every test here."""
    out = tmp_path_factory.mktemp("features")
    entries = [arg for name in BUILT for arg in ("--entry", name)]
    proc = aotc(jax_env, "build", CONFIG, *entries, "--out", out, "--traffic", "8", "--json", timeout=2400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {e["entry"]: e for e in json.loads(proc.stdout)["entries"]}


def plan(name: str):
    return plan_entry(MATRIX.entry(name))


def verified(jax_env, entry: dict) -> dict:
    proc = aotc(jax_env, "verify", entry["artifact_dir"], "--traffic", "8", "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def test_feature_plans_name_what_the_engine_compiles():
    """No engine needed: ngram turns async scheduling off (vLLM's resolution), so neither it nor the async-off
    entry lists the async-only graphs; dp 2 spans two virtual devices."""
    for name in (NGRAM, ASYNC_OFF):
        families = plan(name).families()
        assert not {"substitute_placeholder_token", "subtract_num_rejected_tokens"} & set(families), name
    # why the async-off entry needs no build of its own: the ngram entry's server (async scheduling off too) builds,
    # verifies and serves every graph it plans
    assert {g.key for g in plan(ASYNC_OFF).graphs} <= {g.key for g in plan(NGRAM).graphs}
    assert MATRIX.entry(ASYNC_OFF).model == MATRIX.entry(NGRAM).model
    assert plan(NGRAM).families()["rejection_sampler"] == 2 * len(plan(NGRAM).buckets["logits_paddings"])
    dp2 = plan(DP2)
    assert dp2.buckets["mesh"] == {"axes": {"data": 2, "model": 1}, "devices": 2}
    assert "structured_decoding" not in dp2.families()  # the stack skips it and no dp > 1 server reaches it
    assert buckets.implied_flags(MATRIX.entry(DP2)) == {"XLA_FLAGS": ("--xla_force_host_platform_device_count=2",)}
    # the DP scheduler picks each request's rank, so the step graphs per token x request bucket are planned
    tokens, reqs = dp2.buckets["token_paddings"], dp2.buckets["request_paddings"]
    pairs = sum(r <= t for t in tokens for r in reqs)
    beyond = {family: n for family, n in dp2.families().items()
              if any(g.beyond_warmup for g in dp2.graphs if g.family == family)}
    assert beyond == {"unpack_step_inputs": pairs, "select_prompt_logits": pairs, "prompt_logits_f32": len(tokens),
                      "prompt_logits": len(set(tokens) - set(reqs))}


def test_eagle3_plan_lists_the_drafters_helpers_with_async_scheduling_on():
    """eagle3 keeps async scheduling on (vLLM's resolution) and adds the drafter's helpers, one of each per token
    bucket, and the serving graphs the warm-up skips; its local draft is read beside the matrix."""
    eagle3 = plan(EAGLE3)
    families = eagle3.families()
    tokens, logits = eagle3.buckets["token_paddings"], eagle3.buckets["logits_paddings"]
    assert families["drafter_propose"] == families["drafter_prepare_inputs"] == len(tokens)
    beyond = {g.family for g in eagle3.graphs if g.beyond_warmup}
    assert beyond == {"bonus_sample", "rejection_sampler_logprobs", "unpack_step_inputs"}
    assert families["unpack_step_inputs"] == sum(n <= t for t in tokens for n in logits)
    assert "subtract_num_rejected_tokens" in families
    draft = MATRIX.entry(EAGLE3).engine["speculative_config"]["model"]
    assert draft == str(REPO / "configs" / "models" / "tiny-llama-eagle3")


def test_mtp_plan_lists_the_same_drafter_helpers_as_eagle3():
    """MTP drafts with the target's own prediction layers through the same proposer: tpu-inference's
    _precompile_mtp_helpers compiles the two helpers _precompile_eagle3_helpers does, per token bucket."""
    mtp, eagle3 = plan(MTP), plan(EAGLE3)
    drafter = ("drafter_propose", "drafter_prepare_inputs")
    assert [g.shape for g in mtp.graphs if g.family in drafter] == [g.shape for g in eagle3.graphs if g.family in drafter]
    assert {g.family for g in mtp.graphs if g.beyond_warmup} == {g.family for g in eagle3.graphs if g.beyond_warmup}


def test_dflash_plan_proposes_per_token_and_attention_request_bucket():
    """DFlash's drafter (tpu-inference's _precompile_dflash_helpers) compiles its proposal per token bucket x
    attention request bucket and its input preparation per token bucket, with async scheduling on; its draft
    and target are local dirs beside the matrix."""
    dflash = plan(DFLASH)
    families = dflash.families()
    tokens, attn = dflash.buckets["token_paddings"], dflash.buckets["attention_request_paddings"]
    assert families["drafter_propose"] == len(tokens) * len(attn)
    assert families["drafter_prepare_inputs"] == len(tokens)
    assert "substitute_placeholder_token" in families  # async scheduling on
    assert {g.family for g in dflash.graphs if g.beyond_warmup} == {g.family for g in plan(EAGLE3).graphs
                                                                    if g.beyond_warmup}


TPU_OPTION_JITS = """
import jax, jax.numpy as jnp
from aotc.runners.tpu_inference.twin import jit_without_tpu_options
options = {"xla_tpu_all_gather_collective_matmul_mode": "post_spmd_conservative"}
jit = jit_without_tpu_options(jax.jit)
called = jit(lambda x: x + 1, compiler_options=options)
@jit(compiler_options=options)  # the decorator-factory form eagle3's _propose uses
def decorated(x):
    return x * 2
print(int(called(jnp.int32(1))), int(decorated(jnp.int32(3))))
"""


def test_the_twin_compiles_jits_that_name_tpu_only_compiler_options(jax_env):
    """The drafters' propose steps name TPU compiler options at class definition; XLA:CPU refuses them, the
    twin's jit drops them and compiles the same function."""
    proc = subprocess.run([jax_env["AOTC_PYTHON_TPU_INFERENCE"], "-c", TPU_OPTION_JITS], capture_output=True,
                          text=True, env={**jax_env, "JAX_PLATFORMS": "cpu"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["2", "6"]


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILT)
def test_feature_entry_builds_every_planned_graph_and_verifies_with_zero_misses(jax_env, built, name):
    entry = built[name]
    assert entry["ok"] and entry["graphs_with_keys"] == entry["planned"] == len(plan(name).graphs), entry["problems"]
    result = verified(jax_env, entry)
    assert result["misses"] == 0 and result["loadable"] is True


STRUCTURED = {"structured_choice", "structured_regex", "structured_json"}
# what each entry has no means for (no adapters, no images; no draft tokens; structured outputs at dp > 1)
LACKING = {NGRAM: {"lora", "images"}, EAGLE3: {"lora", "images"}, MTP: {"lora", "images"},
           GEMMA4_MTP: {"lora", "images"}, DFLASH: {"lora", "images"}, DP2: {"lora", "images", "speculative"} | STRUCTURED}


def speculative_unserved_kinds() -> set[str]:
    """The kinds using an option the stack cannot serve with draft tokens (aotc/canary_requests.py)."""
    from aotc.canary_requests import KINDS, SPECULATIVE_UNSERVED

    return {kind.name for kind in KINDS if set(kind.options) & set(SPECULATIVE_UNSERVED)}


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILT)
def test_feature_canary_compiles_nothing_after_ready(jax_env, built, tmp_path, name):
    """The stock server with the feature, from the published artifact, under vLLM's load generator and every
    request kind the entry can take: nothing compiles after ready, every request served or refused by the stack."""
    from tests.helpers.canary import assert_kinds_served, canary, publish_copy

    store, _ = publish_copy(Path(built[name]["artifact_dir"]), tmp_path, jax_env)
    code, doc, err = canary(CONFIG, name, store, jax_env, requests=32)
    assert code == 0, (doc.get("verdict"), doc.get("problems"), err[-2000:])
    assert doc["compiles_at_startup"] == 0 and doc["compiles_after_ready"] == 0 and doc["failed_requests"] == 0
    speculative = "speculative" not in LACKING[name]
    assert_kinds_served(doc, lacking=LACKING[name] | (speculative_unserved_kinds() if speculative else set()))
    if speculative:  # the draft tokens were exercised, not only the plain path
        assert doc["kinds"]["speculative"]["ok"] == doc["kinds"]["speculative"]["sent"] > 0
