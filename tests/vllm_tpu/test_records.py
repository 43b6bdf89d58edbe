"""Capture reporting (judged by the core) and verify bookkeeping on synthetic worker records (no torch)."""

from __future__ import annotations

import pytest

from aotc.build import plan_coverage
from aotc.graphs import BuildPlan, GraphSpec
from aotc.runners.protocol import BuildResult, FamilyRow, Missed
from aotc.runners.records import Record, family_table, missed
from aotc.runners.vllm_tpu.build import capture_calls, capture_outside
from aotc.runners.vllm_tpu.probe import window_record
from aotc.runners.vllm_tpu.records import display_shape, runtime_graphs


def rec(phase, kind, family, shape=None, new=(), rewritten=(), **stats):
    """A worker's record as it crosses from the worker process (plain data), read back as the driver does."""
    return Record.from_dict(window_record(phase, kind, family, shape or {}, list(new), list(rewritten), stats,
                                          0.0).as_dict())


PLAN = BuildPlan(None, (GraphSpec.of("backbone", num_tokens=16, num_reqs=8, num_blocks=8),
                        GraphSpec.of("compute_logits", num_reqs=8)), {})
BACKBONE = PLAN.graphs[0].shape_dict


def judged(recs):
    """What the runner reports of these records, judged by the core (the one judge of plan coverage)."""
    return plan_coverage(PLAN, BuildResult(calls=capture_calls(recs), capture_outside=capture_outside(recs)))


def test_reported_calls_tie_keys_to_planned_graphs_in_plan_order():
    recs = [
        rec("capture", "call", "compute_logits", {"num_reqs": 8}, new=["r/b"], CompileSeconds=0.5),
        rec("capture", "call", "backbone", BACKBONE, new=["r/a"]),
    ]
    graphs, problems = judged(recs)
    assert [g.keys for g in graphs] == [("r/a",), ("r/b",)]
    assert graphs[1].compile_seconds == 0.5
    assert problems == []


def test_an_empty_or_missing_planned_graph_fails():
    _, problems = judged([rec("capture", "call", "backbone", BACKBONE)])
    assert any("produced no cache entry" in e and "backbone" in e for e in problems)
    assert any("never compiled" in e and "compute_logits" in e for e in problems)


def test_unplanned_capture_compiles_fail():
    recs = [
        rec("capture", "call", "backbone", BACKBONE, new=["r/a"]),
        rec("capture", "call", "compute_logits", {"num_reqs": 8}, new=["r/b"]),
        rec("capture", "call", "compute_logits", {"num_reqs": 16}, new=["r/c"]),
        rec("capture", "family", "compute_logits", new=["r/d"]),
    ]
    assert [g.keys for g in capture_outside(recs)] == [["r/d"]]
    _, problems = judged(recs)
    assert problems == ["capture compiled a graph the plan does not list: compute_logits[num_reqs=16]",
                        "capture compiled a graph the plan does not list: compute_logits[outside_call=True]"]


def test_runtime_calls_inherit_their_step_shape():
    step = {"what": "sample_tokens", "num_reqs": 3, "sampling": "greedy+random"}
    recs = [
        rec("runtime", "call", "sample_from_logits", {"num_reqs": 8, "all_greedy": False}, new=["r/x"]),
        rec("runtime", "step", "runtime", step),
    ]
    (graph,) = runtime_graphs(recs)
    assert graph.shape["what"] == "sample_tokens/sample_from_logits"
    assert graph.shape["sampling"] == "greedy+random" and graph.keys == ["r/x"]


def test_verify_counts_new_files_as_misses_and_rewrites_as_failed_loads():
    recs = [
        rec("startup", "phase", "load_model", rewritten=["r/w"], PersistentCacheDeserializeFailure=1),
        rec("capture", "call", "backbone", BACKBONE, new=["r/new"], rewritten=["r/b"],
            PersistentCacheDeserializeFailure=1, UncachedCompile=2),
        rec("runtime", "step", "runtime", {"what": "sample_tokens"}, PersistentCacheHit=1),
    ]
    table = family_table(recs)
    assert table["backbone"] == FamilyRow(found=1, misses=1, new_files=1, rewritten_files=1, compiles=2,
                                          deserialize_failures=1)
    assert table["startup"].found == 1 and table["runtime"].loads == 1
    assert missed(recs, display_shape) == [Missed(family="backbone", shape=BACKBONE, key="r/new")]


def test_verdict_fails_on_misses_and_on_compiles_that_left_no_cache_trace():
    from aotc.runners.vllm_tpu.verify import verdict

    clean = [rec("capture", "call", "backbone", BACKBONE, rewritten=["r/a"], UncachedCompile=1)]
    assert verdict(family_table(clean)) is None
    stray = [rec("runtime", "step", "runtime", {"what": "sample_tokens"}, UncachedCompile=1)]
    assert "bypassed the persistent cache" in verdict(family_table(stray))
    miss = [rec("capture", "call", "backbone", BACKBONE, new=["r/n"], UncachedCompile=1)]
    assert verdict(family_table(miss)) == "1 graph(s) missed the cache in: backbone"


def test_runner_rejects_a_bad_request_with_exit_2(tmp_path):
    import json
    import subprocess
    import sys

    req = tmp_path / "req.json"
    req.write_text(json.dumps({"entry": {"model": "x"}, "plan": []}))
    proc = subprocess.run([sys.executable, "-m", "aotc.runners.vllm_tpu", "build", str(req), str(tmp_path / "r.json")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "bad request" in proc.stderr and "missing" in proc.stderr


@pytest.mark.parametrize("gap", [0, 16, 32])
@pytest.mark.parametrize("seqs,tokens,length", [(8, 64, 128), (12, 256, 2048), (256, 1024, 8192), (64, 512, 16384)])
def test_aotc_plan_is_vllms(gap, seqs, tokens, length):
    from .conftest import aotc_plan, demo_entry, vllm_plan

    entry = demo_entry(VLLM_TPU_BUCKET_PADDING_GAP=gap)
    entry.update(max_num_seqs=seqs, max_num_batched_tokens=tokens, max_model_len=length)
    assert aotc_plan(entry) == vllm_plan(entry)
