"""Incremental builds on the CPU twin: after the demo entry is published, adding one max_num_seqs value and
building reuses what the store holds; the new entry compiles only what the store lacked and verifies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import REPO
from .test_build_verify_jax import aotc

MODEL = REPO / "configs" / "models" / "tiny-llama"
NEW = "tiny-llama-jax--len128-seqs4-tok64-tp1"


def demo(tmp_path: Path, seqs: str) -> Path:
    text = (REPO / "configs" / "demo-jax.yaml").read_text().replace("./models/tiny-llama", str(MODEL))
    config = tmp_path / f"demo-{seqs.replace(', ', '-')}.yaml"
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
