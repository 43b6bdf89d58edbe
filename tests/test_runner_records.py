"""The runners' shared record vocabulary (aotc/runners/records.py), on windows as each backend's probe makes
them: tpu-inference's from JAX's events (probe.Window, no JAX needed to build one), vllm-tpu's from torch_xla's
counters and the cache directory (probe.window_record, no torch)."""

from __future__ import annotations

import os

from aotc.runners import records
from aotc.runners.protocol import FamilyRow, Missed, PlannedGraph, Request
from aotc.runners.records import Judgement, Record, Replay, family_of, family_table, missed
from aotc.runners.tpu_inference.probe import Window
from aotc.runners.vllm_tpu.probe import window_record


def vllm(phase, kind, family, new=(), rewritten=(), **stats):
    return window_record(phase, kind, family, {}, list(new), list(rewritten), stats, 0.0)


def test_each_window_lands_in_the_row_verify_counts_it_in():
    placed = {
        "tpu-inference precompile call": (Window("startup", "call", "sample", {}).record(), "sample"),
        "tpu-inference start-up": (Window("startup", "phase", "startup", {}).record(), records.STARTUP),
        "tpu-inference serving step": (Window("runtime", "step", "runtime", {}).record(), records.RUNTIME),
        "tpu-inference serving outside a step": (Window("runtime", "phase", "runtime", {}).record(), records.RUNTIME),
        "vllm-tpu capture call": (vllm("capture", "call", "backbone"), "backbone"),
        "vllm-tpu family's own code": (vllm("capture", "family", "backbone"), "backbone"),
        "vllm-tpu capture_model outside families": (vllm("capture", "phase", "capture_model"),
                                                    records.CAPTURE_OUTSIDE_FAMILY),
        "vllm-tpu load_model": (vllm("startup", "phase", "load_model"), records.STARTUP),
        "vllm-tpu runtime call": (vllm("runtime", "call", "compute_logits"), records.RUNTIME),
        "vllm-tpu files no window saw": (vllm("runtime", "outside", "unattributed"), records.UNATTRIBUTED),
    }
    assert {what: family_of(record) for what, (record, _) in placed.items()} == {
        what: row for what, (_, row) in placed.items()}


def test_a_jax_window_found_but_not_loadable_is_found_and_no_miss():
    window = Window("startup", "call", "sample", {"num_reqs": 8}, requests=3, hits=1, writes=2, backend_compiles=3,
                    found=["a-cache"], missing=["b-cache"], written=["b-cache", "c-cache"], unloadable=["c-cache"])
    (row,) = family_table([window.record()]).values()
    assert row == FamilyRow(requests=3, found=2, loads=1, misses=1, writes=2, compiles=2, deserialize_failures=0)
    assert missed([window.record()]) == [Missed(family="sample", shape={"num_reqs": 8}, key="b-cache")]
    assert records.touched(window.record()) == ["a-cache", "b-cache", "c-cache"]


def test_a_torch_xla_record_crosses_the_worker_boundary_as_plain_data():
    record = vllm("capture", "call", "backbone", new=["r/n"], rewritten=["r/w"], PersistentCacheHit=2,
                  CompileSeconds=0.5)
    data = record.as_dict()
    assert all(isinstance(value, (str, float, int, tuple, dict)) for value in data.values())
    assert Record.from_dict(data) == record
    assert (record.counts.found, record.counts.new_files, records.compile_seconds([record])) == (3, 1, 0.5)


def test_the_verify_template_replays_on_a_copy_and_lists_planned_families(tmp_path):
    artifact = tmp_path / "cache"
    artifact.mkdir()
    (artifact / "a-cache").write_text("x")

    def replay(request, cache):
        (open(os.path.join(cache, "b-cache"), "w")).close()  # a graph the artifact lacks
        return Replay([vllm("capture", "call", "backbone", new=["b-cache"])], 4, 1.0, len(os.listdir(cache)) - 1)

    def judge(request, seen, table, total):
        return Judgement(loadable=False, evidence=f"{seen.artifact_files} file(s)", metrics=total,
                         error=records.missed_cache(total, table))

    # the template reads only the plan and the cache; the entry is the backend's (its replay's) business
    request = Request.model_construct(entry=None, cache_dir=str(artifact), plan=[
        PlannedGraph(family="backbone", shape={}), PlannedGraph(family="sample", shape={})])
    result = records.run_verify(request, replay, judge)
    assert sorted(os.listdir(artifact)) == ["a-cache"]
    assert list(result.families) == ["backbone", "sample", records.RUNTIME]
    assert (result.misses, result.evidence, result.error) == (1, "1 file(s)", "1 graph(s) missed the cache in: backbone")
