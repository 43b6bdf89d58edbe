"""The canary's verdict from its evidence (no processes here; the slow tests run real servers)."""

from __future__ import annotations

from aotc.canary_verdict import CanaryResult, Phase, Snapshot, name_graphs
from aotc.manifest import GraphRecord, Manifest


def result(**kw) -> CanaryResult:
    return CanaryResult(entry="e", runner=kw.pop("runner", "tpu-inference"), fingerprint="f" * 64, loadable=True, **kw)


def test_nothing_compiled_is_a_pass_naming_the_request_count():
    r = result(requests=510, startup=Phase(lookups=50, hits=50), serving=Phase(lookups=6, hits=6))
    assert r.ok and r.compiles_at_startup == r.compiles_after_ready == 0
    assert r.verdict == "tpu-inference: 0 compiles after ready over 510 requests"


def test_a_graph_the_cache_lacks_fails_and_is_named():
    r = result(requests=4, startup=Phase(new_files=["jit_x-1"]), graphs_missing=["backbone {\"n\": 16} (jit_x-1)"])
    assert not r.ok and r.compiles_at_startup == 1 and "backbone" in r.verdict


def test_strict_failures_on_recompiled_cached_graphs_belong_to_loadability():
    guard = {'aotc_compiles_after_ready_total{family="cached"}': 1.0, "aotc_requests_failed_total": 3.0}
    r = result(runner="vllm-tpu", requests=39, failed_requests=3, guard=guard,
               startup=Phase(rewritten_files=["a"] * 18), serving=Phase(rewritten_files=["b"]))
    assert r.ok and r.strict_failed_cached == 3
    assert "every graph covered over 39 requests; 19 recompiled" in r.verdict and "pytorch/xla#9094" in r.verdict
    # a compile of a family the manifest lacks is never excused
    r.guard = {**guard, 'aotc_compiles_after_ready_total{family="backbone"}': 1.0}
    assert not r.ok and r.unexplained_failures == 3


def test_snapshot_tells_new_from_rewritten(tmp_path):
    (tmp_path / "a-cache").write_bytes(b"1")
    before = Snapshot.of(tmp_path)
    (tmp_path / "a-cache").write_bytes(b"22")
    (tmp_path / "b-cache").write_bytes(b"3")
    (tmp_path / "manifest.json").write_text("{}")
    after = Snapshot.of(tmp_path)
    assert after.new_since(before) == ["b-cache"] and after.rewritten_since(before) == ["a-cache"]


def test_graph_names_come_from_the_manifest():
    manifest = Manifest(entry="e", fingerprint="f", inputs={}, created="now", aotc_version="0", runner="r",
                        device="cpu", graphs=(GraphRecord("backbone", {"num_tokens": 16}, ("tp1_rank0/123",)),))
    assert name_graphs(manifest, ["tp1_rank0/123", "jit_y-9"]) == ["jit_y-9", 'backbone {"num_tokens": 16} (123)']


def test_nothing_published_is_exit_3_in_one_line_before_any_server(tmp_path):
    from .conftest import CONFIGS, run_aotc

    (tmp_path / "store").mkdir()
    proc = run_aotc("canary", CONFIGS / "demo.yaml", "--entry", "tiny-llama--len128-seqs8-tok64-tp1",
                    "--store", tmp_path / "store", "--json")
    assert proc.returncode == 3, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("aotc: ")] == [
        proc.stderr.strip().splitlines()[-1]] and "nothing is published" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_request_count_is_a_usage_error(tmp_path):
    from .conftest import CONFIGS, run_aotc

    proc = run_aotc("canary", CONFIGS / "demo.yaml", "--entry", "x", "--requests", "0")
    assert proc.returncode == 2 and "--requests" in proc.stderr
