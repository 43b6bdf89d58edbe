"""Incremental builds' store side on a real local store: which published files seed a staging cache, and how
a build's reads and writes turn into compiled / reused counts (the engine side: tests/jax/test_incremental_jax.py)."""

from __future__ import annotations

import hashlib

from aotc.runners.protocol import BuildResult
from aotc.publish import publish_artifacts
from aotc.reuse import Seed, seed_cache, settle
from aotc.store import Store

from aotc.testing.artifacts import make_artifact

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
    assert seed_cache(Store.from_url(str(tmp_path / "absent")), STACK, cache) == Seed()


def test_settle_counts_reads_and_writes_and_drops_unread_seeds(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("jit_a-1-cache", "jit_b-2-cache", "jit_new-9-cache"):
        (cache / name).write_bytes(b"x")
    seed = Seed({"jit_a-1-cache": "s1", "jit_b-2-cache": "s2"}, ("tiny--seqs8@abc",))
    reuse = settle(seed, cache, BuildResult(cache_reads=["jit_a-1-cache"], cache_writes=["jit_new-9-cache"]))
    assert (reuse.compiled, reuse.reused, reuse.seeded, reuse.dropped) == (1, 1, 2, 1)
    assert sorted(p.name for p in cache.iterdir()) == ["jit_a-1-cache", "jit_new-9-cache"]
