"""Engine features on the CPU twin, through the real CLI: speculative decoding (ngram), data parallel 2 and async
scheduling off (configs/features-jax.yaml) each build with every planned graph compiled, and a fresh server's
verify finds every graph it compiles in the artifact. Expected counts come from the plan (tests/tpu_inference/test_plan_jax.py
ties it to tpu-inference's own capture_model), never from a previous run."""

from __future__ import annotations

import json

import pytest

from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from aotc.runners.tpu_inference import buckets

from .conftest import REPO
from .test_build_verify_jax import aotc

CONFIG = REPO / "configs" / "features-jax.yaml"
MATRIX = load_matrix(CONFIG)
NGRAM, DP2, ASYNC_OFF = (f"{name}--len128-seqs8-tok64-tp1" for name in ("ngram", "dp2", "async-off"))


@pytest.fixture(scope="module")
def built(jax_env, tmp_path_factory) -> dict[str, dict]:
    """One build of the three entries (one engine process each), shared by every test here."""
    out = tmp_path_factory.mktemp("features")
    proc = aotc(jax_env, "build", CONFIG, "--out", out, "--traffic", "8", "--json", timeout=2400)
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
    assert plan(NGRAM).families()["rejection_sampler"] == 2 * len(plan(NGRAM).buckets["logits_paddings"])
    dp2 = plan(DP2)
    assert dp2.buckets["mesh"] == {"axes": {"data": 2, "model": 1}, "devices": 2}
    assert "structured_decoding" not in dp2.families()  # the stack skips it and no dp > 1 server reaches it
    assert buckets.implied_flags(MATRIX.entry(DP2)) == {"XLA_FLAGS": ("--xla_force_host_platform_device_count=2",)}


@pytest.mark.slow
@pytest.mark.parametrize("name", [NGRAM, DP2, ASYNC_OFF])
def test_feature_entry_builds_every_planned_graph_and_verifies_with_zero_misses(jax_env, built, name):
    entry = built[name]
    assert entry["ok"] and entry["graphs_with_keys"] == entry["planned"] == len(plan(name).graphs), entry["problems"]
    result = verified(jax_env, entry)
    assert result["misses"] == 0 and result["loadable"] is True
