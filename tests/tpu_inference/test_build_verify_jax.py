"""End to end on the CPU twin: the core builds the JAX demo, a fresh process loads every graph back."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from tests.helpers.support_records import saw

from .conftest import REPO, run_jax

DEMO = REPO / "configs" / "demo-jax.yaml"
ENTRY = "tiny-llama-jax--len128-seqs8-tok64-tp1"
# Expected counts come from the plan (tests/tpu_inference/test_plan_jax.py ties it to tpu-inference's own helpers),
# never from a previous run's output.
PLAN = plan_entry(load_matrix(DEMO, check_stack=False).entry(ENTRY))


def aotc(jax_env, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "aotc.cli", *map(str, args)], capture_output=True, text=True,
                          env=jax_env, cwd=REPO, timeout=timeout)
    saw(args, proc.stdout)
    return proc


@pytest.fixture(scope="module")
def artifact(jax_env, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("jax-artifacts")
    proc = aotc(jax_env, "build", DEMO, "--out", out, "--traffic", "16", "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    for family in PLAN.families():  # progress lines from the runner's pipe, as each family finishes
        assert f"aotc build: {ENTRY}: {family} compiled in" in proc.stderr, proc.stderr[-3000:]
    assert report["ok"] and report["entries"][0]["graphs_with_keys"] == report["entries"][0]["planned"] == len(PLAN.graphs)
    return out / ENTRY


@pytest.mark.slow
def test_build_verifies_with_zero_misses_and_real_loads(jax_env, artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["runner"] == "tpu-inference" and manifest["inputs"]["versions"]["jax"] == "0.11.2"
    assert all(f["path"].endswith("-cache") and "/" not in f["path"] for f in manifest["files"])

    proc = aotc(jax_env, "verify", artifact, "--traffic", "24", "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert result["misses"] == 0 and result["loadable"] is True
    families = result["families"]
    planned = PLAN.families()
    # each planned graph is loaded once by the fresh server's precompiles; traffic may add runtime rows
    assert families["backbone"]["loads"] == planned["backbone"] and families["sample"]["loads"] == planned["sample"]
    assert sum(row["loads"] for row in families.values()) == result["replayed_graphs"] > len(PLAN.graphs)
    assert json.loads((artifact / "manifest.json").read_text())["verify"]["loadable"] is True


@pytest.mark.slow
def test_a_missing_cache_file_fails_verify_naming_its_family(jax_env, artifact, tmp_path):
    broken = tmp_path / ENTRY
    shutil.copytree(artifact, broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    victim = next(g for g in manifest["graphs"] if g["family"] == "backbone")["keys"][0]
    (broken / "cache" / victim).unlink()

    proc = aotc(jax_env, "verify", broken, "--traffic", "8")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    said = proc.stdout + proc.stderr
    assert "NOT COVERED: 1 graph(s) missed the cache (backbone)" in said, said[-3000:]


# --- one artifact for every process layout ------------------------------------------


@pytest.mark.slow
def test_an_in_process_llm_on_the_fetched_artifact_compiles_nothing(jax_env, artifact, tmp_path):
    """A user's ``LLM(...)`` in one process imports tpu-inference once, the stock server's engine core (which the
    canary below checks on the same artifact) twice: aotc's plugin collapses both to the build's flags."""
    from tests.helpers.canary import publish_copy

    store, _ = publish_copy(artifact, tmp_path, jax_env)
    one_process = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    dest = tmp_path / "dest"
    proc = aotc(jax_env | one_process | {"XLA_FLAGS": "", "LIBTPU_INIT_ARGS": ""}, "fetch", "--config", DEMO,
                "--entry", ENTRY, "--dest", dest, "--store", store)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # a seed the build's sweep did not use, a few hundred mixed requests: every request and step bucket again
    out = run_jax(jax_env, Path(__file__).parent / "llm_in_process.py",
                  {"config": str(DEMO), "entry": ENTRY, "cache_dir": str(dest), "seed": 7, "requests": 300,
                   "environ": one_process}, timeout=1500)
    assert out["requests"] >= 300
    assert out["startup_new"] == [] and out["traffic_new"] == [], out


# --- the canary: the stock `vllm serve` from a fetched artifact ---------------------


@pytest.mark.slow
def test_canary_stock_server_loads_every_graph_and_compiles_nothing(jax_env, artifact, tmp_path, announce):
    """Under vLLM's load generator and every request kind users send (penalties, n, logprobs, structured
    outputs, chat, streaming, chunked prefill, shared prefixes, ...) in the same batches."""
    from tests.helpers.canary import assert_kinds_served, canary, publish_copy, summary

    store, _ = publish_copy(artifact, tmp_path, jax_env)
    code, doc, err = canary(DEMO, ENTRY, store, jax_env)
    announce(summary(doc))
    assert code == 0, (doc.get("verdict"), doc.get("problems"), err[-2000:])
    # every start-up lookup of the API server + engine-core server hit the build's keys
    assert doc["startup"]["lookups"] == doc["startup"]["hits"] > 0 and doc["startup"]["new_files"] == []
    assert doc["compiles_at_startup"] == 0 and doc["compiles_after_ready"] == 0
    assert doc["requests"] >= 16 and doc["failed_requests"] == 0 and doc["ready_seconds"] > 0
    # prefix caching is vLLM's default for a dense model: the shared-prefix kind took cached blocks
    assert 0 < doc["prefix_cache"]["hits"] < doc["prefix_cache"]["queries"], doc["prefix_cache"]
    assert_kinds_served(doc, lacking={"lora", "speculative", "images"})


@pytest.mark.slow
def test_canary_names_the_graph_a_published_artifact_lacks(jax_env, artifact, tmp_path):
    from tests.helpers.canary import canary, publish_copy

    store, dropped = publish_copy(artifact, tmp_path, jax_env, drop_family="backbone")
    code, doc, err = canary(DEMO, ENTRY, store, jax_env, requests=4)
    assert code == 1, err[-2000:]
    assert [name for name in doc["graphs_missing"] if name.startswith("backbone ")], doc["graphs_missing"]
    assert dropped.removesuffix("-cache") in doc["startup"]["new_files"]
