"""``Store``: one store URL on fsspec primitives. Paths are built from ``layout`` here and nowhere else."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aotc.errors import IntegrityError, NotFoundInStore
from aotc.files import parse_time
from aotc.manifest import Manifest
from aotc.store import layout
from aotc.store.backends import FolderIO, ObjectStoreIO
from aotc.store.url import protocol_of, require_resolvable_host, store_options_from_env

PUBLISH_LEASE_TTL = 6 * 3600.0  # a publish older than this crashed; gc stops waiting for it
GC_LOCK_TTL = 900.0  # gc holds its lock only while deleting; a dead one stops blocking publishers
MANIFEST_READS = 3
MAX_MANIFEST_BYTES = 64 << 20  # far above any real manifest; a bigger "manifest" is damage, not data
DIGEST_KEY = "manifest_sha256"  # the stored manifest's own digest (see ``stored_manifest_bytes``)


@dataclass(frozen=True)
class ObjectInfo:
    sha256: str
    size: int
    mtime: float | None = None
    crc32c: str | None = None  # the backend's own checksum (GCS: base64, on every object), when it reports one
    verified: bool = False  # this process wrote or checked these bytes (publish skips re-checking them)

    def to_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size, "mtime": self.mtime}


class Store:
    """One store URL on fsspec primitives."""

    def __init__(self, fs: Any, root: str, url: str):
        from fsspec.implementations.local import LocalFileSystem

        self.fs, self.root, self.url = fs, root.rstrip("/"), url
        self.is_local = isinstance(fs, LocalFileSystem)
        self._io = (FolderIO if self.is_local else ObjectStoreIO)(fs)
        self.publish_lease_ttl = PUBLISH_LEASE_TTL
        self.gc_lock_ttl = GC_LOCK_TTL

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Store:
        from fsspec.core import url_to_fs

        protocol = protocol_of(url)
        if protocol in ("gs", "gcs"):
            # gcsfs' zonal-bucket probe stalls against emulators and aotc never uses zonal buckets
            os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
            options.setdefault("use_listings_cache", False)  # other processes write here too
        merged = {**store_options_from_env(protocol), **options}
        merged.setdefault("skip_instance_cache", True)
        if protocol in ("gs", "gcs"):
            require_resolvable_host(url, merged)  # before gcsfs' credential probe and retries
        try:
            fs, root = url_to_fs(url, **merged)
        except (TypeError, ValueError, ImportError) as exc:  # unknown option or protocol
            from aotc.errors import BadInput

            raise BadInput(f"store {url}: {type(exc).__name__}: {exc}") from exc
        return cls(fs, root, url)

    # paths
    def path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def object_path(self, sha256: str) -> str:
        return self.path(layout.object_key(sha256))

    def manifest_path(self, entry: str, fingerprint: str) -> str:
        return self.path(layout.manifest_key(entry, fingerprint))

    def ref_path(self, entry: str) -> str:
        return self.path(layout.ref_key(entry))

    def url_of(self, path: str) -> str:
        return self.fs.unstrip_protocol(path)

    def _dir(self, name: str) -> str:
        return self.path(name)

    def relative(self, path: str, under: str) -> str | None:
        prefix = self._dir(under) + "/"
        return path[len(prefix):] if path.startswith(prefix) else None

    # reads
    def exists(self) -> bool:
        return bool(self.fs.exists(self.root))

    def require(self) -> None:
        if not self.exists():
            raise NotFoundInStore(f"store {self.url} does not exist or is empty")

    def find(self, name: str) -> dict[str, dict[str, Any]]:
        """One recursive listing under ``<root>/<name>``: {path: info}; temp files left out."""
        try:
            found = self.fs.find(self._dir(name), detail=True)
        except FileNotFoundError:
            return {}
        return {p: i for p, i in found.items()
                if i.get("type", "file") == "file" and not layout.is_temp_name(p)}

    def list_objects(self) -> tuple[dict[str, ObjectInfo], dict[str, float | None]]:
        """Every well-formed object in one listing, plus {path: mtime} of the rest (temp files…)."""
        objects: dict[str, ObjectInfo] = {}
        strays: dict[str, float | None] = {}
        try:
            found = self.fs.find(self._dir(layout.OBJECTS), detail=True)
        except FileNotFoundError:
            found = {}
        for path, info in found.items():
            sha = layout.split_object_key(self.relative(path, layout.OBJECTS) or "")
            if sha:
                objects[sha] = object_info(sha, info)
            else:
                strays[path] = info_mtime(info)
        return objects, strays

    def stored_object(self, sha256: str) -> ObjectInfo | None:
        """What the backend reports for one object now (one metadata request on GCS); None when absent."""
        try:
            return object_info(sha256, self.fs.info(self.object_path(sha256)))
        except FileNotFoundError:
            return None

    def object_sha256(self, sha256: str, size: int, block: int = 16 << 20) -> str:
        """The sha256 of the stored object's first ``size`` bytes, read back in ranges (for backends that
        report no checksum of their own)."""
        digest, path = hashlib.sha256(), self.object_path(sha256)
        for offset in range(0, size, block):
            digest.update(self.read(path, offset, min(size, offset + block)))
        return digest.hexdigest()

    def read(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        return self._io.read(path, start, end)

    def read_small(self, path: str) -> bytes:
        """A manifest or ref: bounded on a local folder (where a planted FIFO or device could be read);
        whole on an object store (a ranged GET of an empty object is an HTTP error, not data)."""
        return self.read(path, 0, MAX_MANIFEST_BYTES + 1) if self.is_local else self.read(path)

    def read_many(self, paths: list[str]) -> dict[str, bytes | BaseException]:
        if not paths:
            return {}
        if self.is_local:  # bounded, regular files only (see backends.FolderIO.read)
            out: dict[str, bytes | BaseException] = {}
            for path in paths:
                try:
                    out[path] = self.read(path, 0, MAX_MANIFEST_BYTES + 1)
                except (OSError, IntegrityError) as exc:
                    out[path] = exc
            return out
        out = self.fs.cat(paths, on_error="return")
        if len(paths) == 1 and not isinstance(out, dict):
            out = {paths[0]: out}
        return out

    def read_manifest(self, entry: str, fingerprint: str) -> tuple[Manifest, bytes]:
        path = self.manifest_path(entry, fingerprint)
        try:
            return self.load_manifest(path, entry, fingerprint)
        except FileNotFoundError as exc:
            raise NotFoundInStore(f"no manifest {self.url_of(path)}") from exc

    def load_manifest(self, path: str, entry: str, fingerprint: str, data: bytes | None = None
                      ) -> tuple[Manifest, bytes]:
        """Parse and verify a stored manifest, re-reading it while it does not: a body cut short or
        changed in transit can arrive with status 200, and only the parser or the digest notices."""
        for attempt in range(1, MANIFEST_READS + 1):
            data = self.read_small(path) if data is None else data
            try:
                return parse_store_manifest(self.url_of(path), data, entry, fingerprint), data
            except IntegrityError:
                if attempt == MANIFEST_READS:
                    raise
                data = None
        raise AssertionError("unreachable")

    def load_manifests(self, paths: list[str]) -> tuple[list[tuple[str, Manifest, bytes]], list[tuple[str, str]]]:
        """Read and parse in bulk: (path, manifest, bytes), and (path, reason) per damaged manifest."""
        good: list[tuple[str, Manifest, bytes]] = []
        damaged: list[tuple[str, str]] = []
        for path, data in self.read_many(paths).items():
            if isinstance(data, FileNotFoundError):
                continue  # deleted since the listing
            if isinstance(data, IntegrityError):
                damaged.append((path, str(data)))
                continue
            if isinstance(data, BaseException):
                raise data
            names = layout.split_manifest_key(self.relative(path, layout.MANIFESTS) or "")
            if names is None:
                damaged.append((path, f"{self.url_of(path)}: not at manifests/<entry>/<fingerprint>.json"))
                continue
            try:
                good.append((path, *self.load_manifest(path, *names, data=data)))
            except FileNotFoundError:
                continue
            except IntegrityError as exc:
                damaged.append((path, str(exc)))
        return good, damaged

    def read_ref(self, entry: str) -> dict[str, Any] | None:
        try:
            ref = json.loads(self.read_small(self.ref_path(entry)))
        except FileNotFoundError:
            return None
        except (ValueError, RecursionError, IntegrityError):
            return None  # a damaged ref is advisory data: the next publish rewrites it
        return ref if isinstance(ref, dict) else None

    # writes
    def put_object(self, lpath: str, sha256: str) -> None:
        self._io.put(lpath, self.object_path(sha256))

    def create(self, path: str, data: bytes) -> None:
        """Create-if-absent; FileExistsError(path) when something is there (maybe our own retry)."""
        try:
            self._io.create(path, data)
        except FileExistsError as exc:
            raise FileExistsError(f"{self.url_of(path)} already exists") from exc

    def replace(self, path: str, data: bytes) -> None:
        self._io.replace(path, data)

    def delete(self, paths: list[str]) -> None:
        if not paths:
            return
        try:
            self.fs.rm(paths)
        except FileNotFoundError:  # someone deleted some first; some backends then stop at it
            for path in paths:
                try:
                    self.fs.rm_file(path)
                except FileNotFoundError:
                    pass

    def write_ref(self, manifest: Manifest) -> None:
        body = {"entry": manifest.entry, "fingerprint": manifest.fingerprint, "created": manifest.created}
        self.replace(self.ref_path(manifest.entry), (json.dumps(body, sort_keys=True) + "\n").encode())


def stored_manifest_bytes(manifest: Manifest) -> bytes:
    """The bytes a store holds: the manifest plus the sha256 of its canonical form, so a reader can
    tell a manifest changed in transit (a flipped bit inside a path still parses)."""
    data = manifest.to_dict()
    data[DIGEST_KEY] = _canonical_digest(data)
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()


def _canonical_digest(data: dict[str, Any]) -> str:
    body = {k: v for k, v in data.items() if k != DIGEST_KEY}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def parse_store_manifest(path: str, data: bytes, entry: str, fingerprint: str) -> Manifest:
    """A stored manifest, checked against its digest (when it records one) and its path."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise IntegrityError(f"{path}: larger than {MAX_MANIFEST_BYTES} bytes; not a manifest")
    try:
        decoded = Manifest.decode(data)
    except IntegrityError as exc:
        raise IntegrityError(f"{path}: {exc}") from exc
    if isinstance(decoded, dict) and DIGEST_KEY in decoded:
        claimed = decoded.pop(DIGEST_KEY)
        if claimed != _canonical_digest(decoded):
            raise IntegrityError(f"{path}: its bytes do not match the digest it records (changed in transit "
                                 "or by hand)")
    try:
        manifest = Manifest.from_dict(decoded)
    except IntegrityError as exc:
        raise IntegrityError(f"{path}: {exc}") from exc
    if manifest.entry != entry or manifest.fingerprint != fingerprint:
        raise IntegrityError(f"{path}: names entry {manifest.entry!r} fingerprint "
                             f"{manifest.fingerprint!r}, not the ones in its path")
    return manifest


def object_info(sha256: str, info: dict[str, Any]) -> ObjectInfo:
    return ObjectInfo(sha256, int(info.get("size") or 0), info_mtime(info), info.get("crc32c"))


def info_mtime(info: dict[str, Any]) -> float | None:
    """Backends spell modification time differently (gcsfs: mtime datetime; memory: created)."""
    for key in ("mtime", "updated", "LastModified", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            return parse_time(value) or None
    return None
