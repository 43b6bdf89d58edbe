"""Incremental builds' store side on a real local store: which published files seed a staging cache, how
a build's reads and writes turn into compiled / reused counts, and when an entry is taken whole from the store
(the engine side: tests/tpu_inference/test_incremental_jax.py)."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from aotc.build import BuildOptions, build_matrix, runner_process_env
from aotc.fingerprint import fingerprint_entry
from aotc.manifest import RUNTIME, GraphRecord, Manifest
from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from aotc.publish import publish_artifacts
from aotc.reuse import SeededCache, published_artifact, seed_cache, settle, take_published
from aotc.runners.protocol import BuildResult
from aotc.store import Store
from aotc.testing.artifacts import make_artifact, tree

STACK = {"runner": "tpu-inference", "device": "cpu", "model": "tiny", "versions": {"jax": "0.11.2"},
         "xla_flags": [], "max_num_seqs": 8}


def publish(tmp_path, store_url, entry, files, inputs):
    artifact = make_artifact(tmp_path / "artifacts", entry=entry, files=files, inputs=inputs)
    publish_artifacts([str(artifact)], store_url)


def test_seeds_only_compatible_artifacts_files_checked_by_sha256(tmp_path):
    url = str(tmp_path / "store")
    publish(tmp_path, url, "tiny--seqs8", {"jit_a-1-cache": b"a", "jit_b-2-cache": b"b"}, STACK)
    publish(tmp_path, url, "tiny--other-stack", {"jit_c-3-cache": b"c"}, {**STACK, "versions": {"jax": "0.9"}})
    publish(tmp_path, url, "tiny--seqs4", {"jit_d-4-cache": b"d"}, {**STACK, "max_num_seqs": 4})
    store = Store.from_url(url)
    # a damaged object in the store is not seeded (the build compiles that graph instead)
    damaged = store.object_path(hashlib.sha256(b"d").hexdigest())
    store.fs.pipe_file(damaged, b"not d")

    cache = tmp_path / "staging" / "cache"
    cache.mkdir(parents=True)
    seed = seed_cache(store, {**STACK, "max_num_seqs": 16}, cache)
    assert sorted(p.name for p in cache.iterdir()) == ["jit_a-1-cache", "jit_b-2-cache"]
    assert (cache / "jit_a-1-cache").read_bytes() == b"a"
    assert seed.files == {"jit_a-1-cache": hashlib.sha256(b"a").hexdigest(), "jit_b-2-cache": hashlib.sha256(b"b").hexdigest()}
    assert len(seed.sources) == 2  # seqs8 and seqs4 (whose one object is damaged)


def test_no_store_seeds_nothing(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    assert seed_cache(Store.from_url(str(tmp_path / "absent")), STACK, cache) == SeededCache()


def test_settle_counts_reads_and_writes_and_drops_unread_seeds(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("jit_a-1-cache", "jit_b-2-cache", "jit_new-9-cache"):
        (cache / name).write_bytes(b"x")
    seed = SeededCache({"jit_a-1-cache": "s1", "jit_b-2-cache": "s2"}, ("tiny--seqs8@abc",))
    reuse = settle(seed, cache, BuildResult(cache_reads=["jit_a-1-cache"], cache_writes=["jit_new-9-cache"]))
    assert (reuse.compiled, reuse.reused, reuse.seeded, reuse.dropped) == (1, 1, 2, 1)
    assert sorted(p.name for p in cache.iterdir()) == ["jit_a-1-cache", "jit_new-9-cache"]


# --- an entry the store already holds whole ---------------------------------------------------------

DEMO = Path(__file__).resolve().parent.parent / "configs" / "demo-jax.yaml"


def publish_entry(tmp_path, url, *, traffic=16, seed=0, graphs_left_out=0, fingerprint=None):
    """Publish the demo entry's artifact as a build of it would record it: a key for every planned graph
    (but the last ``graphs_left_out``), one runtime graph, the sweep's traffic and seed."""
    entry = load_matrix(DEMO).entries[0]
    plan = plan_entry(entry)
    fp = fingerprint_entry(entry, runner_process_env(entry))
    art = make_artifact(tmp_path / "published", entry=entry.name, inputs=fp.inputs,
                        fingerprint=fingerprint or fp.digest, files={"jit_a-1-cache": b"a", "sub/jit_b-2-cache": b"b"})
    kept = plan.graphs[:len(plan.graphs) - graphs_left_out]
    graphs = (*(GraphRecord(g.family, g.shape_dict, (f"jit_g-{i}",)) for i, g in enumerate(kept)),
              GraphRecord(RUNTIME, {"family": "sample"}, ("jit_a-1",)))
    replace(Manifest.load(art), graphs=graphs, extra={"build": {"traffic": traffic, "seed": seed}}).save(art)
    publish_artifacts([str(art)], url)
    return plan, fp.digest


@pytest.mark.needs_jax
def test_an_entry_published_as_this_build_would_make_it_is_taken_whole(tmp_path):
    url = str(tmp_path / "store")
    plan, digest = publish_entry(tmp_path, url)
    store = Store.from_url(url)
    report = build_matrix(load_matrix(DEMO), out_dir=tmp_path / "out",
                          options=BuildOptions(traffic_requests=16, seed=0, store=store))
    taken = report.entries[0]
    assert report.ok and taken.source == "store" and (taken.compiled, taken.reused) == (0, 2)
    assert (taken.planned, taken.graphs_with_keys, taken.runtime_graphs) == (len(plan.graphs), len(plan.graphs), 1)
    artifact = Path(taken.artifact_dir)
    # the manifest and every file, nothing of a runner's (no runner started: no log)
    assert Manifest.load(artifact) == store.read_manifest(plan.entry.name, digest)[0]
    assert tree(artifact) == {"manifest.json": (artifact / "manifest.json").read_bytes(),
                              "cache/jit_a-1-cache": b"a", "cache/sub/jit_b-2-cache": b"b"}
    assert [r.status for r in publish_artifacts([str(artifact)], url)] == ["already"]


@pytest.mark.needs_jax
@pytest.mark.parametrize("published", [
    {"traffic": 32},  # another sweep: its runtime graphs may differ
    {"seed": 1},
    {"graphs_left_out": 1},  # published by an aotc whose plan lacked a graph
    {"fingerprint": "f" * 64},  # only another fingerprint's artifact
])
def test_an_entry_the_store_holds_otherwise_is_not_taken(tmp_path, published):
    url = str(tmp_path / "store")
    plan, digest = publish_entry(tmp_path, url, **published)
    assert published_artifact(Store.from_url(url), plan, digest, traffic=16, seed=0) is None


@pytest.mark.needs_jax
def test_a_damaged_object_means_building_with_nothing_kept(tmp_path):
    url = str(tmp_path / "store")
    plan, digest = publish_entry(tmp_path, url)
    store = Store.from_url(url)
    store.fs.pipe_file(store.object_path(hashlib.sha256(b"b").hexdigest()), b"not b")
    staging = tmp_path / "staging"
    assert take_published(store, published_artifact(store, plan, digest, traffic=16, seed=0), staging) is False
    assert not (staging / "manifest.json").exists()
    assert published_artifact(Store.from_url(str(tmp_path / "absent")), plan, digest, traffic=16, seed=0) is None
