"""Incremental builds: seed an entry's staging cache with the store's objects from compatible published
artifacts, so the backend finds what the store already holds and compiles only the rest.

Only for a runner whose stack reads its persistent cache back (``RunnerSpec.cache_loads``). Reuse is safe by
construction: a file's name is the backend's own cache key over the program, the compile options, the
devices, the flags and the stack's versions, so a seeded file is used only when the graph is the same, and a
changed key input simply misses. Compatibility (same stack and model) only spares downloading objects that
could not match. After the build, seeded files the entry never read are dropped from its artifact.

Its limit case, for any runner: an entry whose own fingerprint is already published, with every graph its plan
lists and the same traffic sweep, is taken from the store as it is (``published_artifact``), without
starting the stack: rebuilding it could only produce the same graphs.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aotc.errors import IntegrityError, NotFoundInStore
from aotc.graphs import BuildPlan, GraphSpec
from aotc.manifest import CACHE_DIR_NAME, Manifest, check_relative_path
from aotc.runners.protocol import BuildResult

# Fingerprint inputs that must be equal for two entries to share any graph (stack, model, devices, flags);
# the matrix axes, engine arguments and runner env may differ: those change only some keys.
SHARED_INPUTS = ("runner", "device", "accelerator", "versions", "model", "revision", "model_config_sha256",
                 "dtype", "xla_flags", "mesh")


@dataclass(frozen=True)
class SeededCache:
    """What was put into a staging cache: {file name: sha256} and the artifacts it came from."""

    files: dict[str, str] = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"seeded": len(self.files), "sources": list(self.sources)}


@dataclass(frozen=True)
class Reuse:
    """Per entry: graphs (cache files) the build compiled and those it found seeded from the store."""

    compiled: int
    reused: int
    seeded: int
    dropped: int
    sources: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"compiled": self.compiled, "reused": self.reused, "seeded": self.seeded, "dropped": self.dropped,
                "sources": list(self.sources)}


def compatible(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    return all(ours.get(k) == theirs.get(k) for k in SHARED_INPUTS)


def candidates(store, inputs: dict[str, Any]) -> list[Manifest]:
    """Published manifests of the same stack and model, newest first (this very fingerprint's too: a rebuild
    then compiles nothing the store holds)."""
    if not store.exists():
        return []
    found, _damaged = store.load_manifests(sorted(store.find("manifests")))  # damaged ones: not reused
    manifests = [m for _, m, _ in found if compatible(inputs, m.inputs)]
    return sorted(manifests, key=lambda m: m.created, reverse=True)


def seed_cache(store, inputs: dict[str, Any], cache_dir: Path) -> SeededCache:
    """Download each cache file the compatible artifacts hold (by sha256, checked) into ``cache_dir``."""
    wanted: dict[str, str] = {}
    sources = []
    for manifest in candidates(store, inputs):
        new = {f.path: f.sha256 for f in manifest.files if f.path not in wanted}
        if new:
            wanted.update(new)
            sources.append(f"{manifest.entry}@{manifest.fingerprint[:12]}")
    return SeededCache(download(store, wanted, cache_dir), tuple(sources))


def download(store, wanted: dict[str, str], cache_dir: Path) -> dict[str, str]:
    """Write each {file name: sha256} whose object the store holds intact into ``cache_dir``; return those
    written (a missing or damaged object is left out: that graph just compiles)."""
    paths = {store.object_path(sha): sha for sha in set(wanted.values())}
    blobs = store.read_many(sorted(paths))
    files = {}
    for name, sha in wanted.items():
        data = blobs.get(store.object_path(sha))
        if isinstance(data, bytes) and hashlib.sha256(data).hexdigest() == sha:
            target = cache_dir / check_relative_path(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            files[name] = sha
    return files


def published_artifact(store, plan: BuildPlan, fingerprint: str, traffic: int, seed: int) -> Manifest | None:
    """The store's artifact of this entry and fingerprint, if building it again could only produce the same:
    it holds a cache key for every graph the plan lists and was swept with the same traffic (count and seed)."""
    try:
        manifest, _ = store.read_manifest(plan.entry.name, fingerprint)
    except (NotFoundInStore, IntegrityError):  # none (or no store), or a damaged manifest: build it
        return None
    build = manifest.extra.get("build", {})
    if (build.get("traffic"), build.get("seed")) != (traffic, seed):
        return None
    held = {GraphSpec(g.family, tuple(g.shape.items())).key for g in manifest.graphs if g.keys}
    return manifest if all(spec.key in held for spec in plan.graphs) else None


def take_published(store, manifest: Manifest, artifact_dir: Path) -> bool:
    """Write the published artifact into ``artifact_dir`` as its build left it (the manifest, every file
    checked by sha256); False, with nothing to keep, if any object is missing or damaged."""
    wanted = {f.path: f.sha256 for f in manifest.files}
    if len(download(store, wanted, artifact_dir / CACHE_DIR_NAME)) != len(wanted):
        return False
    manifest.save(artifact_dir)
    return True


def settle(seed: SeededCache, cache_dir: Path, result: BuildResult) -> Reuse:
    """After the build: drop seeded files the entry never read; count compiled vs reused cache files.
    ``result`` carries the runner's ``cache_reads`` / ``cache_writes`` (file names)."""
    reads, writes = set(result.cache_reads), set(result.cache_writes)
    reused = {name for name in seed.files if name in reads and name not in writes}
    dropped = [name for name in seed.files if name not in reads and name not in writes]
    for name in dropped:
        os.unlink(cache_dir / name)
    return Reuse(compiled=len(writes), reused=len(reused), seeded=len(seed.files), dropped=len(dropped),
                 sources=seed.sources)
