"""End-to-end on PJRT CPU: real vLLM start-up, real XLA compiles, the real persistent cache."""

from __future__ import annotations

import json

import pytest

from aotc.build import plan_coverage
from aotc.graphs import BuildPlan, GraphSpec
from aotc.matrix import load_matrix
from aotc.runners.protocol import BuildResult

from .conftest import DEMO, DEMO_NAME, VERIFY_SEED, VERIFY_TRAFFIC, assert_built_as_planned, build, demo_entry

pytestmark = pytest.mark.slow


def assert_plan_covered(run) -> list:
    """The runner's report judged by the core, as `aotc build` judges it; returns the planned graphs."""
    assert run.returncode == 0, run.result.get("error")
    plan = BuildPlan(None, tuple(GraphSpec.from_dict(p) for p in run.request["plan"]), {})
    graphs, problems = plan_coverage(plan, BuildResult.model_validate(run.result))
    assert problems == [], "every planned graph has a cache key and capture compiled nothing unplanned"
    return graphs


def manifest_graphs(demo_build, family: str) -> list[dict]:
    manifest = json.loads((demo_build.artifact / "manifest.json").read_text())
    return [g for g in manifest["graphs"] if g["family"] == family]


def test_demo_build_every_planned_graph_has_keys_and_nothing_unplanned(demo_build):
    """The run's one demo build (tests/vllm_tpu/conftest.py), judged by the core as `aotc build` judges it (capture
    compiling anything unplanned is a problem); test_e2e.py checks its manifest accounts for every file."""
    entry = load_matrix(DEMO).entry(DEMO_NAME)
    assert_built_as_planned(entry, demo_build.report, demo_build.artifact)
    assert all(k.startswith("tp1_rank0/") for g in manifest_graphs(demo_build, "backbone") for k in g["keys"])


def test_padding_gap_build_covers_vllm_incremental_buckets(tmp_path):
    run = build(demo_entry(VLLM_TPU_BUCKET_PADDING_GAP=16), tmp_path)
    graphs = assert_plan_covered(run)
    tokens = [g.shape["num_tokens"] for g in graphs if g.family == "backbone"]
    assert tokens == [16, 32, 48, 64]  # incremental, not the demo's exponential 16/32/64


def test_fresh_build_verifies_with_zero_misses_on_unseen_traffic_seed(demo_build):
    result = demo_build.verify
    build_seed = json.loads((demo_build.artifact / "manifest.json").read_text())["build"]["seed"]
    assert result["seed"] == VERIFY_SEED != build_seed
    assert result["misses"] == 0 and result["missed"] == []
    assert result["traffic_requests"] >= VERIFY_TRAFFIC
    assert result["replayed_graphs"] == len(demo_build.cache_before_verify)


def test_verify_reports_loadable_false_with_the_deserialize_evidence(demo_build):
    # torch_xla 2.9.0 writes its persistent cache but cannot load it (pytorch/xla#9094).
    result = demo_build.verify
    assert result["loadable"] is False
    for family, row in result["families"].items():
        assert row["loads"] == 0, family
        assert row["deserialize_failures"] == row["rewritten_files"], family
    assert "failing to deserialize" in result["evidence"]


def test_verify_never_writes_the_artifact(demo_build):
    assert demo_build.cache_before_verify == demo_build.cache_after_verify


def test_runtime_sweep_records_mixed_sampling_graph_and_verify_replays_it(demo_build):
    runtime = manifest_graphs(demo_build, "runtime")
    mixed = [g for g in runtime if g["shape"]["sampling"] == "greedy+random"]
    assert mixed, f"the sweep should compile the mixed greedy+random sampler capture never traces: {runtime}"
    assert all(g["keys"] for g in runtime)
    verified = demo_build.verify["families"]["runtime"]
    assert verified["misses"] == 0
    assert verified["found"] >= len({k for g in runtime for k in g["keys"]})
