"""Publish artifact dirs: verify them, upload the blobs the store lacks, commit with the manifest.

Order per artifact: objects (parallel, only the missing ones, found with one listing), then the manifest
with a create-only write (the commit point), then the ref. A crash before the manifest leaves only
unreferenced blobs, which gc collects; a crash after it leaves a complete artifact, and a re-run repairs
the ref. The whole call holds a publish lease so a concurrent gc keeps the blobs it is about to use.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aotc.errors import CheckFailed, IntegrityError
from aotc.manifest import CACHE_DIR_NAME, Manifest
from aotc.store import (
    Meter,
    ObjectInfo,
    Store,
    check_name,
    human_size,
    parse_time,
    progress_callback,
    run_parallel,
    sha256_file,
)

PUBLISHED, ALREADY, OTHER_WON = "published", "already", "other_won"
DEFAULT_WORKERS = 16


@dataclass(frozen=True)
class PublishResult:
    artifact_dir: str
    entry: str
    fingerprint: str
    status: str  # published | already (identical manifest was there) | other_won (a different one was)
    manifest_url: str
    files: int
    size: int
    uploaded_objects: int
    uploaded_size: int
    reused_objects: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 3)
        return data


@dataclass(frozen=True)
class LocalArtifact:
    """An artifact dir whose every file was hashed and matched its manifest."""

    path: str
    manifest: Manifest
    data: bytes  # canonical manifest JSON: identical artifacts give identical bytes
    sources: dict[str, str]  # sha256 -> a local file with that content

    @property
    def sizes(self) -> dict[str, int]:
        return {f.sha256: f.size for f in self.manifest.files}


def load_artifact(artifact_dir: str, workers: int = 4) -> LocalArtifact:
    manifest = Manifest.load(artifact_dir)
    if manifest.verify and manifest.verify.misses:
        # a pod would compile those graphs mid-serving: a failed verify publishes nothing
        raise CheckFailed(f"{artifact_dir}: verify found {manifest.verify.misses} cache miss(es); "
                          "rebuild, re-run aotc verify, then publish")
    check_name(manifest.entry, "entry name")
    check_name(manifest.fingerprint, "fingerprint")
    cache = Path(artifact_dir) / CACHE_DIR_NAME

    def check(record: Any) -> tuple[str, str]:
        local = cache / record.path
        if local.is_symlink() or not local.is_file():
            raise IntegrityError(f"{local}: listed in the manifest but not a regular file")
        sha, size = sha256_file(str(local))
        if size != record.size or sha != record.sha256:
            raise IntegrityError(f"{local}: sha256 {sha[:16]}… size {size} does not match the manifest "
                                 f"({record.sha256[:16]}… size {record.size})")
        return record.sha256, str(local)

    sources = dict(run_parallel(check, manifest.files, workers))
    return LocalArtifact(str(artifact_dir), manifest, manifest.to_json().encode(), sources)


def publish_artifacts(artifact_dirs: list[str], url: str, progress: bool = False, callback: Any = None,
                      workers: int = DEFAULT_WORKERS, store: Store | None = None) -> list[PublishResult]:
    """Verify every dir first (IntegrityError before anything is uploaded), then publish each."""
    artifacts = [load_artifact(d, workers=min(workers, os.cpu_count() or 2)) for d in artifact_dirs]
    store = store or Store.from_url(url)
    with store.lock("publish") as lease:
        store.wait_for_gc(lease)
        present, _ = store.list_objects()
        total = sum(a.manifest.total_size for a in artifacts)
        meter = Meter(callback or progress_callback(progress, "publish"), total)
        try:
            return [_publish_one(store, a, present, meter, workers) for a in artifacts]
        finally:
            meter.close()


def _publish_one(store: Store, art: LocalArtifact, present: dict[str, ObjectInfo], meter: Meter,
                 workers: int) -> PublishResult:
    started = time.monotonic()
    entry, fingerprint = art.manifest.entry, art.manifest.fingerprint
    path = store.manifest_path(entry, fingerprint)
    existing = _read_or_none(store, path)
    if existing is not None and existing != art.data:
        meter.add(art.manifest.total_size)
        return _result(store, art, OTHER_WON, path, [], started)
    # Also when the manifest is already there: re-uploading what a damaged store lost is the repair.
    uploaded = _upload_missing(store, art, present, meter, workers)
    status = ALREADY if existing is not None else _commit(store, path, art.data)
    if status != OTHER_WON:
        _update_ref(store, art.manifest)
    return _result(store, art, status, path, uploaded, started)


def _upload_missing(store: Store, art: LocalArtifact, present: dict[str, ObjectInfo], meter: Meter,
                    workers: int) -> list[str]:
    sizes = art.sizes
    missing = [sha for sha in art.sources if sha not in present or present[sha].size != sizes[sha]]
    meter.add(sum(sizes[s] for s in art.sources if s not in missing))

    def upload(sha: str) -> str:
        store.put_object(art.sources[sha], sha)
        meter.add(sizes[sha])
        return sha

    # biggest first, so one large blob does not start last and set the wall time alone
    done = run_parallel(upload, sorted(missing, key=lambda s: -sizes[s]), workers)
    present.update({sha: ObjectInfo(sha, sizes[sha]) for sha in done})
    return done


def _commit(store: Store, path: str, data: bytes) -> str:
    """The create-only manifest write. FileExistsError may be our own retried write: compare bytes."""
    try:
        store.create(path, data)
        return PUBLISHED
    except FileExistsError:
        return PUBLISHED if store.read(path) == data else OTHER_WON


def _read_or_none(store: Store, path: str) -> bytes | None:
    try:
        return store.read(path)
    except FileNotFoundError:
        return None


def _update_ref(store: Store, manifest: Manifest) -> None:
    """Point the ref at this manifest unless it already names a newer one (advisory; see store)."""
    ref = store.read_ref(manifest.entry)
    if ref and ref.get("fingerprint") == manifest.fingerprint:
        return
    if ref and parse_time(str(ref.get("created", ""))) > parse_time(manifest.created):
        return
    store.write_ref(manifest)


def _result(store: Store, art: LocalArtifact, status: str, path: str, uploaded: list[str],
            started: float) -> PublishResult:
    sizes = art.sizes
    return PublishResult(
        artifact_dir=art.path, entry=art.manifest.entry, fingerprint=art.manifest.fingerprint,
        status=status, manifest_url=store.url_of(path), files=len(art.manifest.files),
        size=art.manifest.total_size, uploaded_objects=len(uploaded),
        uploaded_size=sum(sizes[s] for s in uploaded), reused_objects=len(art.sources) - len(uploaded),
        seconds=time.monotonic() - started)


def render_publish(results: list[PublishResult], url: str, console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"published to {url}", title_justify="left")
    for column in ("entry", "fingerprint", "status", "uploaded", "reused", "size", "seconds"):
        table.add_column(column)
    labels = {PUBLISHED: "[green]published[/green]", ALREADY: "already there",
              OTHER_WON: "[yellow]another publish won[/yellow]"}
    for r in results:
        table.add_row(r.entry, r.fingerprint[:16], labels.get(r.status, r.status),
                      f"{r.uploaded_objects} ({human_size(r.uploaded_size)})", str(r.reused_objects),
                      human_size(r.size), f"{r.seconds:.1f}")
    console.print(table)
