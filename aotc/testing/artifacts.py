"""Synthetic artifact dirs (manifest.json + cache/), until real builds exist."""

from __future__ import annotations

import hashlib
import json
import os
import random
from datetime import datetime, timezone
from pathlib import Path

from aotc.manifest import FileRecord, Manifest


def random_files(count: int, seed: int = 0, low: int = 64, high: int = 8192, prefix: str = "tp1_rank0"
                 ) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {f"{prefix}/{rng.getrandbits(64):016x}": rng.randbytes(rng.randint(low, high)) for _ in range(count)}


def make_artifact(root: str | Path, entry: str = "model-a--len2048-tp1", files: dict[str, bytes] | None = None,
                  inputs: dict | None = None, created: str | None = None, name: str | None = None,
                  fingerprint: str | None = None) -> Path:
    """Write an artifact dir; the fingerprint defaults to a sha256 of the entry and inputs."""
    files = random_files(6) if files is None else files
    inputs = inputs if inputs is not None else {"model": entry, "versions": {"vllm": "0.13.0"}}
    fingerprint = fingerprint or hashlib.sha256(json.dumps([entry, inputs], sort_keys=True).encode()).hexdigest()
    out = Path(root) / (name or f"{entry}-{fingerprint[:8]}")
    for rel, data in files.items():
        path = out / "cache" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    records = tuple(FileRecord(rel, hashlib.sha256(d).hexdigest(), len(d)) for rel, d in sorted(files.items()))
    manifest = Manifest(entry=entry, fingerprint=fingerprint, inputs=inputs,
                        created=created or datetime.now(timezone.utc).isoformat(), aotc_version="0.1.0",
                        runner="vllm-tpu", device="cpu", files=records)
    manifest.save(out)
    return out


def tree(path: str | Path) -> dict[str, bytes]:
    """{relative path: bytes} of every regular file under path (links reported as such)."""
    out = {}
    root = Path(path)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            out[rel] = b"<link>" if full.is_symlink() else full.read_bytes()
    return out


def expected_dest(artifact_dir: str | Path) -> dict[str, bytes]:
    """What a fetch of this artifact must leave in dest: cache/ contents plus manifest.json."""
    out = {k: v for k, v in tree(Path(artifact_dir) / "cache").items()}
    manifest = Manifest.load(artifact_dir)
    out["manifest.json"] = manifest.to_json().encode()
    return out
