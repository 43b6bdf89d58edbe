"""A third backend registered only through the ``aotc.runners`` entry point (tests/toy_runner: a package
with its own dist-info, found by importlib.metadata like any installed distribution) goes through
plan → build → verify → publish → fetch with the real CLI and no core edit.

The toy "compiles" a graph by writing a file, so this runs in seconds; it tests the runner interface and
the protocol (typed request and results, progress on a pipe), not a compiler.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections import Counter
from pathlib import Path

import pytest

from .conftest import run_aotc
from .helpers.cli import json_output

TOY = Path(__file__).parent / "toy_runner"


def _toy_rules():
    """The toy's plan rules, loaded by file: this process derives the expected counts from them without
    putting the toy on its own path (which would register it for every other test here)."""
    spec = importlib.util.spec_from_file_location("toy_buckets", TOY / "aotc_toy_runner" / "buckets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


buckets = _toy_rules()

ENTRY = "toy-model--len512-seqs16-tok64-tp1"
MATRIX = """
defaults: {runner: toy, device: cpu}
models:
  - name: toy-model
    model: org/toy-model
    matrix: {max_model_len: [512], max_num_seqs: [16], max_num_batched_tokens: [64]}
"""


def toy(*args, env=None, **kwargs):
    path = os.pathsep.join(filter(None, [str(TOY), os.environ.get("PYTHONPATH")]))
    return run_aotc(*args, env={"PYTHONPATH": path, **(env or {})}, **kwargs)


def ok_json(*args, **kwargs) -> dict:
    return json_output(toy(*args, "--json", **kwargs))


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("toy") / "matrix.yaml"
    path.write_text(MATRIX)
    return path


def toy_entry():
    """ENTRY as the matrix makes it."""
    from aotc.matrix import Entry

    return Entry(name=ENTRY, model_name="toy-model", model="org/toy-model", revision="main", runner="toy",
                 device="cpu", accelerator="v6e-8", dtype="bfloat16", max_model_len=512, max_num_seqs=16,
                 max_num_batched_tokens=64, tensor_parallel_size=1)


@pytest.fixture(scope="module")
def expected(config):
    return buckets.PLANNER.capture_plan(toy_entry(), None)


@pytest.fixture(scope="module")
def built(config, expected, tmp_path_factory):
    out = tmp_path_factory.mktemp("toy-out")
    proc = toy("build", config, "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / ENTRY, json.loads(proc.stdout), proc.stderr


def test_the_core_does_not_know_the_toy_without_its_entry_point(config):
    proc = run_aotc("plan", config)
    assert proc.returncode == 2
    assert "unknown runner 'toy'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_plan_uses_the_toys_rules(config, expected):
    doc = ok_json("plan", config)
    [plan] = doc["entries"]
    assert plan["runner"] == "toy" and plan["total"] == len(expected)
    assert plan["graphs"] == [g.to_dict() for g in expected]


def test_the_toys_own_entry_rule_is_a_matrix_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(MATRIX.replace("max_model_len: [512]", "max_model_len: [8192]"))
    proc = toy("plan", bad)
    assert proc.returncode == 2
    assert "models['toy-model'].matrix.max_model_len: the toy stops at 4096" in proc.stderr


def test_build_writes_one_keyed_graph_per_planned_graph_and_reports_progress(built, expected):
    artifact, report, stderr = built
    [entry] = report["entries"]
    assert entry["ok"] and entry["planned"] == entry["graphs_with_keys"] == len(expected)
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["runner"] == "toy"
    assert [(g["family"], g["shape"]) for g in manifest["graphs"]] == [(g.family, g.shape_dict) for g in expected]
    assert {f["path"] for f in manifest["files"]} == {buckets.cache_file(g.family, g.shape_dict) for g in expected}
    assert manifest["inputs"]["versions"] == {"pyyaml": manifest["inputs"]["versions"]["pyyaml"]}
    for family in dict.fromkeys(g.family for g in expected):  # one progress line per family, from the pipe
        assert stderr.count(f"aotc build: {ENTRY}: {family} compiled in") == 1, stderr


def test_verify_publish_fetch(built, config, expected, tmp_path):
    artifact, _, _ = built
    result = ok_json("verify", artifact)
    assert result["ok"] and result["loadable"] and result["replayed_graphs"] == len(expected)
    assert {name: row["found"] for name, row in result["families"].items()} == Counter(g.family for g in expected)

    store = f"file://{tmp_path / 'store'}"
    ok_json("publish", artifact, "--store", store)
    dest = tmp_path / "dest"
    fetched = ok_json("fetch", "--config", config, "--entry", ENTRY, "--dest", dest, "--store", store)
    assert fetched["fingerprint"] == json.loads((artifact / "manifest.json").read_text())["fingerprint"]
    assert sorted(p.name for p in (dest).iterdir() if p.is_file() and p.name != "manifest.json") == sorted(
        f.name for f in (artifact / "cache").iterdir())


def test_an_unpinned_entry_gets_the_full_length_rule_in_the_toys_kv_block_size(built, config, tmp_path):
    """The toy's stack does not size its KV cache (no SizedByStack): an entry that pins no block count gets
    RunnerSpec.kv_blocks' default, every sequence at max_model_len in blocks of the planner's
    ``kv_block_size`` tokens, + vLLM's null block; the fingerprint hashes it and the build pins it. A matrix's
    num_gpu_blocks_override still wins."""
    entry = toy_entry()
    full_length = entry.max_num_seqs * math.ceil(entry.max_model_len / buckets.PLANNER.kv_block_size(entry)) + 1
    assert ok_json("fingerprint", config, "--entry", ENTRY)["inputs"]["kv_blocks"] == full_length
    artifact, _, _ = built
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["inputs"]["kv_blocks"] == manifest["build"]["entry"]["engine"]["num_gpu_blocks_override"] \
        == full_length
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(config.read_text().replace("device: cpu}", "device: cpu, engine: {num_gpu_blocks_override: 7}}"))
    assert ok_json("fingerprint", pinned, "--entry", ENTRY)["inputs"]["kv_blocks"] == 7


def test_the_toys_env_var_enters_the_fingerprint(config):
    plain = ok_json("fingerprint", config, "--entry", ENTRY)
    salted = ok_json("fingerprint", config, "--entry", ENTRY, env={"AOTC_TOY_SALT": "1"})
    assert salted["fingerprint"] != plain["fingerprint"] and salted["inputs"]["env"] == {"AOTC_TOY_SALT": "1"}


def test_the_matrix_sets_the_toys_own_env_var_as_the_environment_does(config, tmp_path):
    """The matrix's env: takes what the entry's runner declares (its env_vars here), not a list in the core;
    a variable another runner's stack reads, or none does, is refused in one line."""
    salted = tmp_path / "salted.yaml"
    salted.write_text(config.read_text().replace("device: cpu}", "device: cpu, env: {AOTC_TOY_SALT: 1}}"))
    from_matrix = ok_json("fingerprint", salted, "--entry", ENTRY)
    assert from_matrix == ok_json("fingerprint", config, "--entry", ENTRY, env={"AOTC_TOY_SALT": "1"})
    for var, reason in [("VLLM_TPU_BUCKET_PADDING_GAP", "runner toy's stack does not read it"),
                        ("AOTC_TOY_SALTS", "unknown key")]:
        wrong = tmp_path / "wrong.yaml"
        wrong.write_text(config.read_text().replace("device: cpu}", f"device: cpu, env: {{{var}: 1}}}}"))
        proc = toy("plan", wrong)
        assert proc.returncode == 2 and proc.stderr == f"aotc: error: {wrong}: defaults.env.{var}: {reason}\n"


def test_a_missing_cache_file_fails_verify(built, tmp_path):
    import shutil

    artifact, _, _ = built
    broken = Path(shutil.copytree(artifact, tmp_path / ENTRY))
    victim = sorted((broken / "cache").iterdir())[0]
    victim.unlink()
    proc = toy("verify", broken, "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["missed"][0]["key"] == victim.name


def test_a_planned_family_the_runner_never_compiled_fails_the_build(config, expected, tmp_path):
    proc = toy("build", config, "--out", tmp_path, "--json", env={"AOTC_TOY_SKIP": "pick"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    [entry] = json.loads(proc.stdout)["entries"]
    skipped = [g for g in expected if g.family == "pick"]
    assert not entry["ok"] and entry["problems"] == [
        f"planned graph was never compiled by the runner: pick[{g.label}]" for g in skipped]
    assert f"aotc build: {ENTRY}: FAILED: planned graph was never compiled" in proc.stderr
    assert not (tmp_path / ENTRY).exists()  # nothing half-built is swapped in
