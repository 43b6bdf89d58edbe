"""Publish artifact dirs: verify them, upload the blobs the store lacks, commit with the manifest.

Order per artifact: objects (parallel, only the missing ones, found with one listing), then the manifest
with a create-only write (the commit point), then the ref. A crash before the manifest leaves only
unreferenced blobs, which gc collects; a crash after it leaves a complete artifact, and a re-run repairs
the ref. The whole call holds a publish lease so a concurrent gc keeps the blobs it is about to use.

Nothing is taken on trust, neither what the store already holds nor what an upload stored: each object is
compared with the local bytes whose sha256 was checked (their size, then the crc32c the backend reports —
GCS lists one for every object, so nothing is downloaded — else the stored bytes read back and re-hashed).
An object found different is uploaded again; an upload the store reports different bytes for is sent
again, up to ``UPLOAD_ATTEMPTS`` times, then the artifact fails with an IntegrityError and its manifest
is never written. The ref names the newest manifest of the entry: after writing it, a publisher lists the entry's
manifests again and rewrites it until the newest it sees is the one it names, so the last writer always
wrote the newest (every manifest is committed before its publisher touches the ref).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aotc.errors import CheckFailed, IntegrityError
from aotc.files import parse_time, sha256_crc32c_file
from aotc.manifest import CACHE_DIR_NAME, Manifest
from aotc.store import Meter, ObjectInfo, Store, check_name, run_parallel, stored_manifest_bytes
from aotc.store.leases import hold, wait_for_gc

PUBLISHED, ALREADY, OTHER_WON = "published", "already", "other_won"
DEFAULT_WORKERS = 16
UPLOAD_ATTEMPTS = 3  # per object: uploads the store may report different bytes for, before giving up

logger = logging.getLogger(__name__)


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
    repaired_objects: int = 0  # found in the store with other bytes than the local file's, uploaded again
    retried_uploads: int = 0  # uploads the store reported different bytes for, sent again

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 3)
        return data


@dataclass(frozen=True)
class LocalArtifact:
    """An artifact dir whose every file was hashed and matched its manifest."""

    path: str
    manifest: Manifest
    data: bytes  # the stored form (canonical JSON + its digest): identical artifacts give identical bytes
    sources: dict[str, str]  # sha256 -> a local file with that content
    crc32c: dict[str, str]  # sha256 -> the crc32c of the bytes that hashed to it (GCS's spelling)

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

    def check(record: Any) -> tuple[str, str, str]:
        local = cache / record.path
        if local.is_symlink() or not local.is_file():
            raise IntegrityError(f"{local}: listed in the manifest but not a regular file")
        sha, size, crc32c = sha256_crc32c_file(str(local))
        if size != record.size or sha != record.sha256:
            raise IntegrityError(f"{local}: sha256 {sha[:16]}… size {size} does not match the manifest "
                                 f"({record.sha256[:16]}… size {record.size})")
        return record.sha256, str(local), crc32c

    checked = run_parallel(check, manifest.files, workers)
    return LocalArtifact(str(artifact_dir), manifest, stored_manifest_bytes(manifest),
                         {sha: path for sha, path, _ in checked}, {sha: crc for sha, _, crc in checked})


def publish_artifacts(artifact_dirs: list[str], url: str, callback: Any = None,
                      workers: int = DEFAULT_WORKERS, store: Store | None = None) -> list[PublishResult]:
    """Verify every dir first (IntegrityError before anything is uploaded), then publish each."""
    artifacts = [load_artifact(d, workers=min(workers, os.cpu_count() or 2)) for d in artifact_dirs]
    store = store or Store.from_url(url)
    with hold(store, "publish") as lease:
        wait_for_gc(store, lease)
        present, _ = store.list_objects()
        total = sum(a.manifest.total_size for a in artifacts)
        meter = Meter(callback, total)
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
    if existing is not None and not _same_manifest(existing, art):
        meter.add(art.manifest.total_size)
        return _result(store, art, OTHER_WON, path, None, started)
    # Also when the manifest is already there: re-uploading what a damaged store lost is the repair.
    # An object that cannot be stored intact raises here, before the manifest: nothing is committed.
    upload = _upload_missing(store, art, present, meter, workers)
    status = ALREADY if existing is not None else _commit(store, path, art)
    if status != OTHER_WON:
        _update_ref(store, art.manifest)
    return _result(store, art, status, path, upload, started)


def _same_manifest(stored: bytes, art: LocalArtifact) -> bool:
    """Byte-equal, or (a manifest published before manifests recorded their digest) the same content."""
    if stored == art.data:
        return True
    try:
        return Manifest.from_json(stored).to_json() == art.manifest.to_json()
    except IntegrityError:
        return False


@dataclass(frozen=True)
class _Upload:
    uploaded: list[str]
    repaired: int = 0
    retried: int = 0


def _upload_missing(store: Store, art: LocalArtifact, present: dict[str, ObjectInfo], meter: Meter,
                    workers: int) -> _Upload:
    sizes = art.sizes
    missing = [sha for sha in art.sources if sha not in present]
    suspect = [sha for sha in art.sources if sha in present and not present[sha].verified]
    damaged = [sha for sha, why in zip(suspect, run_parallel(
        lambda sha: _stored_mismatch(store, present[sha], art), suspect, workers)) if why]
    missing += damaged
    meter.add(sum(sizes[s] for s in art.sources if s not in missing))

    def upload(sha: str) -> int:
        retries = _upload_intact(store, art, sha)
        meter.add(sizes[sha])
        return retries

    # biggest first, so one large blob does not start last and set the wall time alone
    order = sorted(missing, key=lambda s: -sizes[s])
    retries = run_parallel(upload, order, workers)
    present.update({sha: ObjectInfo(sha, sizes[sha], verified=True) for sha in art.sources})
    return _Upload(order, len(damaged), sum(retries))


def _upload_intact(store: Store, art: LocalArtifact, sha: str) -> int:
    """Upload until the store reports the checked local bytes; how many uploads were sent again."""
    url, why = store.url_of(store.object_path(sha)), ""
    for attempt in range(1, UPLOAD_ATTEMPTS + 1):
        store.put_object(art.sources[sha], sha)
        stored = store.stored_object(sha)
        why = _stored_mismatch(store, stored, art) if stored else "no object"
        if why is None:
            return attempt - 1
        if attempt < UPLOAD_ATTEMPTS:
            logger.warning("publish: %s: the store holds %s after upload %d of %d; uploading it again",
                           url, why, attempt, UPLOAD_ATTEMPTS)
    raise IntegrityError(f"{url}: the store holds {why} after {UPLOAD_ATTEMPTS} uploads of "
                         f"{art.sources[sha]}; {art.manifest.entry} not published (no manifest written)")


def _stored_mismatch(store: Store, stored: ObjectInfo, art: LocalArtifact) -> str | None:
    """How the stored object differs from the checked local bytes, or None when it holds them: the size,
    then the backend's crc32c (GCS: no download), else the stored bytes read back and re-hashed."""
    sha = stored.sha256
    if stored.size != art.sizes[sha]:
        return f"{stored.size} bytes, not {art.sizes[sha]}"
    if stored.crc32c:
        return None if stored.crc32c == art.crc32c[sha] else f"crc32c {stored.crc32c}, not {art.crc32c[sha]}"
    digest = store.object_sha256(sha, stored.size)
    return None if digest == sha else f"sha256 {digest}, not {sha}"


def _commit(store: Store, path: str, art: LocalArtifact) -> str:
    """The create-only manifest write. FileExistsError may be our own retried write: compare bytes."""
    try:
        store.create(path, art.data)
        return PUBLISHED
    except FileExistsError:
        return PUBLISHED if _same_manifest(store.read(path), art) else OTHER_WON


def _read_or_none(store: Store, path: str) -> bytes | None:
    try:
        return store.read(path)
    except FileNotFoundError:
        return None


def _update_ref(store: Store, manifest: Manifest, rounds: int = 20) -> None:
    """Point the ref at the entry's newest manifest (see the module docstring for why this converges)."""
    for _ in range(rounds):
        newest = _newest_manifest(store, manifest.entry) or manifest
        ref = store.read_ref(manifest.entry)
        if ref and ref.get("fingerprint") == newest.fingerprint:
            return
        store.write_ref(newest)


def _newest_manifest(store: Store, entry: str) -> Manifest | None:
    found, _ = store.load_manifests(sorted(store.find(f"manifests/{check_name(entry, 'entry name')}")))
    if not found:
        return None
    return max((m for _, m, _ in found), key=lambda m: (parse_time(m.created), m.fingerprint))


def _result(store: Store, art: LocalArtifact, status: str, path: str, upload: _Upload | None,
            started: float) -> PublishResult:
    sizes, upload = art.sizes, upload or _Upload([])
    return PublishResult(
        artifact_dir=art.path, entry=art.manifest.entry, fingerprint=art.manifest.fingerprint,
        status=status, manifest_url=store.url_of(path), files=len(art.manifest.files),
        size=art.manifest.total_size, uploaded_objects=len(upload.uploaded),
        uploaded_size=sum(sizes[s] for s in upload.uploaded),
        reused_objects=len(art.sources) - len(upload.uploaded), seconds=time.monotonic() - started,
        repaired_objects=upload.repaired, retried_uploads=upload.retried)
