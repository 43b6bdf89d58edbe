"""Incremental builds on the CPU twin: after the demo entry is published, adding one max_num_seqs value and
building reuses what the store holds; the new entry compiles only what the store lacked and verifies, and once
it is published too, rebuilding the grown matrix takes both entries whole from the store."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import REPO
from .test_build_verify_jax import aotc

MODEL = REPO / "configs" / "models" / "tiny-llama"
NEW = "tiny-llama-jax--len128-seqs4-tok64-tp1"


def demo(tmp_path: Path, seqs: str) -> Path:
    text = (REPO / "configs" / "demo-jax.yaml").read_text().replace("./models/tiny-llama", str(MODEL))
    config = tmp_path / f"demo-{seqs.replace(', ', '-')}.yaml"
    # a pinned KV block count (room for 16 full-length sequences): these builds test reuse and the step grid,
    # not the stack's KV sizing, which would cost each new entry an engine start
    text = text.replace("  dtype: bfloat16", "  dtype: bfloat16\n  engine: {num_gpu_blocks_override: 129}")
    config.write_text(text.replace("max_num_seqs: [8]", f"max_num_seqs: [{seqs}]"))
    return config


def built(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)["entries"]


@pytest.mark.slow
def test_new_entry_compiles_only_what_the_store_lacks(jax_env, tmp_path):
    store = tmp_path / "store"
    first = built(aotc(jax_env, "build", demo(tmp_path, "8"), "--out", tmp_path / "a", "--store", store,
                       "--traffic", "16", "--json"))[0]
    assert first["reused"] == 0 and first["compiled"] == first["files"]
    assert aotc(jax_env, "publish", first["artifact_dir"], "--store", store).returncode == 0
    published = {f["path"] for f in json.loads((Path(first["artifact_dir"]) / "manifest.json").read_text())["files"]}

    entries = built(aotc(jax_env, "build", demo(tmp_path, "8, 4"), "--entry", NEW, "--out", tmp_path / "b",
                         "--store", store, "--traffic", "16", "--json"))
    new = entries[0]
    manifest = json.loads((Path(new["artifact_dir"]) / "manifest.json").read_text())
    reuse = manifest["build"]["reuse"]
    files = {f["path"] for f in manifest["files"]}
    assert new["reused"] > 0 and new["compiled"] + new["reused"] == new["files"] == len(files)
    assert reuse["seeded"] == len(published) and reuse["reused"] + reuse["dropped"] == reuse["seeded"]
    # every file the build compiled is one the store lacked; every reused one came from the store
    compiled = files - published
    assert len(compiled) == new["compiled"] and len(files & published) == new["reused"]

    proc = aotc(jax_env, "verify", new["artifact_dir"], "--traffic", "16", "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert result["misses"] == 0 and result["loadable"] is True

    # Rebuilding the grown matrix once both are published starts no engine: each entry is taken as published.
    assert aotc(jax_env, "publish", new["artifact_dir"], "--store", store).returncode == 0
    proc = aotc(jax_env, "build", demo(tmp_path, "8, 4"), "--out", tmp_path / "c", "--store", store, "--traffic", "16",
                "--json")
    again = {e["entry"]: e for e in built(proc)}
    for source in (first, new):
        taken = again[source["entry"]]
        assert taken["source"] == "store" and taken["compiled"] == 0 and taken["reused"] == source["files"]
        assert "up to date, taken as published" in proc.stderr
        before, after = Path(source["artifact_dir"]), Path(taken["artifact_dir"])
        for name in ("manifest.json", *(f"cache/{f}" for f in os.listdir(before / "cache"))):
            assert (after / name).read_bytes() == (before / name).read_bytes()
        assert not (after / "build.log").exists()
