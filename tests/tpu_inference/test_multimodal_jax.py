"""A vision-language model end to end on the CPU twin, through the real CLI: the tiny Qwen2.5-VL of
configs/multimodal-jax.yaml builds every planned graph (its vision encoder at the warm-up image shapes, the
input-embeddings merger, the backbone over input embeddings; tests/tpu_inference/test_plan_jax.py ties the plan to
tpu-inference's own capture_model), a fresh server's verify under text and image traffic, and the stock server
under chat requests with images. One build, shared by every test here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aotc.graphs import GraphSpec
from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from tests.conftest import run_aotc

from .conftest import REPO

CONFIG = REPO / "configs" / "multimodal-jax.yaml"
[ENTRY] = load_matrix(CONFIG).entries
MULTIMODAL_FAMILIES = {"input_embeddings_merger", "input_embeddings_merger_text_only", "backbone_with_embeds"}


@pytest.fixture(scope="module")
def built(jax_env, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("multimodal")
    proc = run_aotc("build", CONFIG, "--out", out, "--traffic", "8", "--no-reuse", "--json", env=jax_env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [report] = json.loads(proc.stdout)["entries"]
    return out / ENTRY.name, report


def test_multimodal_plan_lists_the_vision_families_once_per_shape():
    plan = plan_entry(ENTRY)
    assert MULTIMODAL_FAMILIES <= set(plan.families())
    assert "vision_encoder" not in plan.families()  # no warm-up image shapes: the stack compiles none
    assert plan.families()["backbone_with_embeds"] == len(plan.buckets["token_paddings"])


@pytest.mark.slow
def test_multimodal_entry_builds_every_planned_graph_and_only_those(built):
    artifact, report = built
    expected = plan_entry(ENTRY)
    assert report["ok"] and report["planned"] == report["graphs_with_keys"] == len(expected.graphs), report
    manifest = json.loads((artifact / "manifest.json").read_text())
    precompiled = [g for g in manifest["graphs"] if g["family"] in expected.families()]
    assert sorted(GraphSpec.from_dict(g).key for g in precompiled) == sorted(g.key for g in expected.graphs)
    assert all(g["keys"] for g in manifest["graphs"]), "a planned graph left no cache file"


@pytest.mark.slow
def test_multimodal_entry_verifies_under_image_traffic(built, jax_env, announce):
    artifact, _ = built
    proc = run_aotc("verify", artifact, "--traffic", "8", "--json", env=jax_env, timeout=1800)
    result = json.loads(proc.stdout)
    announce(f"multimodal verify: {result['misses']} misses, {result['traffic_requests']} requests, "
             f"missed {[m['family'] for m in result['missed']][:10]}")
    assert proc.returncode == 0 and result["misses"] == 0 and result["loadable"] is True, result.get("error")
    for family, count in plan_entry(ENTRY).families().items():
        assert result["families"][family]["loads"] >= count, family


@pytest.mark.slow
def test_multimodal_canary_stock_server_compiles_nothing_after_ready(built, jax_env, tmp_path, announce):
    from tests.helpers.canary import canary, publish_copy

    artifact, _ = built
    store, _ = publish_copy(artifact, tmp_path, jax_env)
    code, doc, err = canary(CONFIG, ENTRY.name, store, jax_env, requests=32)
    announce(f"multimodal canary: {doc.get('requests')} requests, {doc.get('compiles_after_ready')} compiles after "
             f"ready, {doc.get('graphs_missing', [])[:5]}")
    assert code == 0, (doc.get("verdict"), doc.get("problems"), err[-2000:])
    assert doc["compiles_at_startup"] == 0 and doc["compiles_after_ready"] == 0
    assert doc["failed_requests"] == 0
