"""The artifact store: content-addressed objects, manifests as commit markers, refs, scan and gc.

Layout (DESIGN.md), under any fsspec URL::

    objects/sha256/<2 hex>/<sha256>        immutable blobs shared by every entry
    manifests/<entry>/<fingerprint>.json   written last, create-only: its presence means complete
    refs/<entry>.json                      the newest fingerprint per entry (advisory)
    locks/publish-<id>.json                a publish in flight (see "gc safety" below)
    locks/gc-<id>.json                     a gc deleting objects

Atomicity per backend: object stores (gs://, memory://, s3://) make an upload visible whole, and
``pipe_file(mode="create")`` is a native create-if-absent (``ifGenerationMatch=0`` on GCS). A POSIX
folder has neither, so there every write goes to a hidden sibling first and becomes visible by
``rename`` (objects, refs) or by a hard ``link``, which fails when the target exists (manifests).

gc safety: a publisher may list the objects, find a blob it needs already there, and write a manifest
that references it minutes later; the blobs it uploads are unreferenced until then. So gc (1) plans from
a scan, (2) writes its own ``locks/gc-*`` marker, (3) deletes the planned manifests, (4) lists
``locks/publish-*`` and, if a live one exists, keeps every object (deferred to the next run), (5) otherwise
re-reads all manifests and deletes only objects that are still unreferenced and older than ``min_age``.
A publisher writes its lease before it lists gc markers, and waits while a live gc marker exists. Both
sides write and then read, so with a strongly consistent listing (GCS, a local folder) at least one sees
the other: either gc defers, or the publisher lists the objects after gc finished.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

from aotc.errors import BadInput, IntegrityError, NotFoundInStore
from aotc.manifest import Manifest

DEFAULT_STORE_DIR = ".aotc/store"
ENV_STORE = "AOTC_STORE"
ENV_STORE_OPTIONS = "AOTC_STORE_OPTIONS"  # JSON dict of fsspec storage options
ENV_STORE_ENDPOINT = "AOTC_STORE_ENDPOINT"  # gs:// endpoint (an emulator); implies anonymous access
ENV_STORAGE_EMULATOR = "STORAGE_EMULATOR_HOST"

PUBLISH_LEASE_TTL = 6 * 3600.0  # a publish older than this crashed; gc stops waiting for it
GC_LOCK_TTL = 900.0  # gc holds its lock only while deleting; a dead one stops blocking publishers
DEFAULT_MIN_AGE = 3600.0  # gc never deletes a blob younger than this (defence in depth)
MANIFEST_READS = 3

SHA256_HEX = re.compile(r"[0-9a-f]{64}")
logger = logging.getLogger(__name__)
_T = TypeVar("_T")
_R = TypeVar("_R")


# --- URL and options ------------------------------------------------------------------------------


def resolve_store_url(cli_url: str | None, config_store: str | None = None) -> str:
    """--store > $AOTC_STORE > the config's ``store:`` > ``.aotc/store`` under the cwd."""
    for candidate in (cli_url, os.environ.get(ENV_STORE), config_store):
        if candidate:
            return candidate
    return os.path.abspath(DEFAULT_STORE_DIR)


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,199}")


def check_name(value: str, what: str) -> str:
    """Entry names and fingerprints become store path components: one plain segment each."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise IntegrityError(f"unsafe {what} for a store path: {value!r}")
    return value


def _protocol(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else "file"


def store_options_from_env(protocol: str) -> dict[str, Any]:
    """Storage options a CLI user (or a test) can only pass through the environment."""
    options: dict[str, Any] = {}
    raw = os.environ.get(ENV_STORE_OPTIONS)
    if raw:
        try:
            options.update(json.loads(raw))
        except json.JSONDecodeError as exc:
            raise BadInput(f"${ENV_STORE_OPTIONS} is not a JSON object: {exc}") from exc
    if protocol in ("gs", "gcs"):
        endpoint = os.environ.get(ENV_STORE_ENDPOINT) or os.environ.get(ENV_STORAGE_EMULATOR)
        if endpoint:
            options.setdefault("endpoint_url", endpoint)
            options.setdefault("token", "anon")  # an emulator has no auth; probing for it stalls
    return options


# --- small shared helpers -------------------------------------------------------------------------


def sha256_file(path: str, block: int = 4 << 20) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def run_parallel(fn: Callable[[_T], _R], items: Iterable[_T], workers: int) -> list[_R]:
    """``map`` on a thread pool that stops at the first error and raises it (not a wrapped one)."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(fn, item) for item in items]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        for future in futures:
            if future.done() and not future.cancelled() and future.exception():
                raise future.exception()  # type: ignore[misc]
        return [f.result() for f in futures]


class Meter:
    """A byte counter that many worker threads feed into one fsspec Callback."""

    def __init__(self, callback: Any = None, total: int = 0):
        from fsspec.callbacks import NoOpCallback

        self._callback = callback or NoOpCallback()
        self._lock = threading.Lock()
        self._callback.set_size(total)

    def add(self, n: int) -> None:
        with self._lock:
            self._callback.relative_update(n)

    def close(self) -> None:
        close = getattr(self._callback, "close", None)
        if close:
            close()


def progress_callback(progress: bool, description: str) -> Any:
    """A tqdm bar on stderr when asked for; the library itself only ever talks to the Callback."""
    if not progress:
        return None
    from fsspec.callbacks import TqdmCallback

    return TqdmCallback(tqdm_kwargs={"desc": description, "unit": "B", "unit_scale": True,
                                     "unit_divisor": 1024, "file": sys.stderr, "leave": False})


def parse_time(text: str) -> float:
    """ISO-8601 → epoch seconds; unparseable sorts oldest (0.0)."""
    try:
        stamp = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return 0.0
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def _mtime(info: dict[str, Any]) -> float | None:
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


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


# --- backend write semantics ----------------------------------------------------------------------


class _ObjectStoreWrites:
    """Uploads become visible whole; create-if-absent is native (GCS: ifGenerationMatch=0)."""

    def __init__(self, fs: Any):
        self.fs = fs

    def put(self, lpath: str, rpath: str) -> None:
        self.fs.put_file(lpath, rpath)

    def create(self, rpath: str, data: bytes) -> None:
        self.fs.pipe_file(rpath, data, mode="create")

    def replace(self, rpath: str, data: bytes) -> None:
        self.fs.pipe_file(rpath, data)


class _FolderWrites(_ObjectStoreWrites):
    """A POSIX folder: write a hidden sibling, then rename (replace) or hard-link (create-if-absent).

    A SIGKILL mid-copy then leaves only a ``.tmp-`` file that readers ignore and gc removes.
    """

    def _aside(self, rpath: str) -> str:
        parent, name = rpath.rsplit("/", 1)
        self.fs.makedirs(parent, exist_ok=True)
        return f"{parent}/.{name}.tmp-{uuid.uuid4().hex}"

    def put(self, lpath: str, rpath: str) -> None:
        tmp = self._aside(rpath)
        try:
            self.fs.put_file(lpath, tmp)
            self.fs.mv(tmp, rpath)
        finally:
            _remove_quietly(tmp)

    def replace(self, rpath: str, data: bytes) -> None:
        tmp = self._aside(rpath)
        try:
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, rpath)
        finally:
            _remove_quietly(tmp)

    def create(self, rpath: str, data: bytes) -> None:
        tmp = self._aside(rpath)
        try:
            self.fs.pipe_file(tmp, data)
            os.link(tmp, rpath)  # atomic and exclusive; no fsspec primitive has both
        finally:
            _remove_quietly(tmp)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def is_temp_name(path: str) -> bool:
    return ".tmp-" in path.rsplit("/", 1)[-1]


# --- the store ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectInfo:
    sha256: str
    size: int
    mtime: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size, "mtime": self.mtime}


class Store:
    """One store URL on fsspec primitives. Paths are built here and nowhere else."""

    def __init__(self, fs: Any, root: str, url: str):
        from fsspec.implementations.local import LocalFileSystem

        self.fs, self.root, self.url = fs, root.rstrip("/"), url
        self.is_local = isinstance(fs, LocalFileSystem)
        self._writes = (_FolderWrites if self.is_local else _ObjectStoreWrites)(fs)
        self.publish_lease_ttl = PUBLISH_LEASE_TTL
        self.gc_lock_ttl = GC_LOCK_TTL

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Store:
        from fsspec.core import url_to_fs

        protocol = _protocol(url)
        if protocol in ("gs", "gcs"):
            # gcsfs' zonal-bucket probe stalls against emulators and aotc never uses zonal buckets
            os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
            options.setdefault("use_listings_cache", False)  # other processes write here too
        merged = {**store_options_from_env(protocol), **options}
        merged.setdefault("skip_instance_cache", True)
        fs, root = url_to_fs(url, **merged)
        return cls(fs, root, url)

    # paths
    def object_path(self, sha256: str) -> str:
        return f"{self.root}/objects/sha256/{sha256[:2]}/{sha256}"

    def manifest_path(self, entry: str, fingerprint: str) -> str:
        return f"{self.root}/manifests/{check_name(entry, 'entry name')}/{check_name(fingerprint, 'fingerprint')}.json"

    def ref_path(self, entry: str) -> str:
        return f"{self.root}/refs/{check_name(entry, 'entry name')}.json"

    def url_of(self, path: str) -> str:
        return self.fs.unstrip_protocol(path)

    def _dir(self, name: str) -> str:
        return f"{self.root}/{name}"

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
        return {p: i for p, i in found.items() if i.get("type", "file") == "file" and not is_temp_name(p)}

    def list_objects(self) -> tuple[dict[str, ObjectInfo], dict[str, float | None]]:
        """Every well-formed object in one listing, plus {path: mtime} of the rest (temp files…)."""
        objects: dict[str, ObjectInfo] = {}
        strays: dict[str, float | None] = {}
        prefix = self._dir("objects/sha256") + "/"
        try:
            found = self.fs.find(self._dir("objects/sha256"), detail=True)
        except FileNotFoundError:
            found = {}
        for path, info in found.items():
            rel = path[len(prefix):] if path.startswith(prefix) else path
            two, _, sha = rel.partition("/")
            if SHA256_HEX.fullmatch(sha) and sha[:2] == two:
                objects[sha] = ObjectInfo(sha, int(info.get("size") or 0), _mtime(info))
            else:
                strays[path] = _mtime(info)
        return objects, strays

    def read(self, path: str) -> bytes:
        return self.fs.cat_file(path)

    def read_many(self, paths: list[str]) -> dict[str, bytes | BaseException]:
        if not paths:
            return {}
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
        """Parse a stored manifest, re-reading it while it does not parse: a body cut short in
        transit can arrive with status 200, and only the parser notices."""
        for attempt in range(1, MANIFEST_READS + 1):
            data = self.read(path) if data is None else data
            try:
                return parse_store_manifest(self.url_of(path), data, entry, fingerprint), data
            except IntegrityError:
                if attempt == MANIFEST_READS:
                    raise
                data = None
        raise AssertionError("unreachable")

    def load_manifests(self, paths: list[str]) -> tuple[list[tuple[str, Manifest, bytes]], list[str]]:
        """Read and parse in bulk: (path, manifest, bytes) and one message per damaged manifest."""
        good: list[tuple[str, Manifest, bytes]] = []
        damaged: list[str] = []
        for path, data in self.read_many(paths).items():
            if isinstance(data, FileNotFoundError):
                continue  # deleted since the listing
            if isinstance(data, BaseException):
                raise data
            names = self._split_manifest_path(path)
            if names is None:
                damaged.append(f"{self.url_of(path)}: not at manifests/<entry>/<fingerprint>.json")
                continue
            try:
                good.append((path, *self.load_manifest(path, *names, data=data)))
            except FileNotFoundError:
                continue
            except IntegrityError as exc:
                damaged.append(str(exc))
        return good, damaged

    def _split_manifest_path(self, path: str) -> tuple[str, str] | None:
        prefix = self._dir("manifests") + "/"
        parts = path[len(prefix):].split("/") if path.startswith(prefix) else []
        if len(parts) != 2 or not parts[1].endswith(".json"):
            return None
        return parts[0], parts[1][: -len(".json")]

    def read_ref(self, entry: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.read(self.ref_path(entry)))
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # a damaged ref is advisory data: the next publish rewrites it

    # writes
    def put_object(self, lpath: str, sha256: str) -> None:
        self._writes.put(lpath, self.object_path(sha256))

    def create(self, path: str, data: bytes) -> None:
        """Create-if-absent; FileExistsError(path) when something is there (maybe our own retry)."""
        try:
            self._writes.create(path, data)
        except FileExistsError as exc:
            raise FileExistsError(f"{self.url_of(path)} already exists") from exc

    def replace(self, path: str, data: bytes) -> None:
        self._writes.replace(path, data)

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

    # locks (see the module docstring for the protocol)
    @contextmanager
    def lock(self, kind: str) -> Iterator[str]:
        path = f"{self._dir('locks')}/{kind}-{uuid.uuid4().hex}.json"
        body = {"kind": kind, "pid": os.getpid(), "host": os.uname().nodename,
                "started": datetime.now(timezone.utc).isoformat()}
        self.replace(path, json.dumps(body).encode())
        try:
            yield path
        finally:
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass

    def server_time(self, path: str) -> float:
        """The store's clock, read from a file we just wrote, so lock ages ignore client skew."""
        try:
            return _mtime(self.fs.info(path)) or time.time()
        except FileNotFoundError:
            return time.time()

    def live_locks(self, kind: str, now: float, ttl: float, mine: str | None = None) -> list[str]:
        prefix = f"{self._dir('locks')}/{kind}-"
        live = []
        for path, info in self.find("locks").items():
            if not path.startswith(prefix) or path == mine:
                continue
            mtime = _mtime(info)
            if mtime is None or now - mtime < ttl:
                live.append(path)
        return live

    def wait_for_gc(self, lease: str, poll: float = 0.5) -> None:
        """A publisher must not list objects while a gc is deleting them (a dead gc's lock expires)."""
        written, started = self.server_time(lease), time.monotonic()
        while self.live_locks("gc", written + time.monotonic() - started, self.gc_lock_ttl):
            logger.info("waiting for a gc of %s to finish", self.url)
            time.sleep(poll)

    # scan
    def scan(self) -> StoreInfo:
        self.require()
        return _scan(self)


def parse_store_manifest(path: str, data: bytes, entry: str, fingerprint: str) -> Manifest:
    try:
        manifest = Manifest.from_json(data)
    except IntegrityError as exc:
        raise IntegrityError(f"{path}: {exc}") from exc
    if manifest.entry != entry or manifest.fingerprint != fingerprint:
        raise IntegrityError(f"{path}: names entry {manifest.entry!r} fingerprint "
                             f"{manifest.fingerprint!r}, not the ones in its path")
    return manifest


# --- scan -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ManifestInfo:
    entry: str
    fingerprint: str
    created: str
    path: str
    file_count: int
    size: int
    objects: frozenset[str]
    missing_objects: int = 0

    @property
    def created_ts(self) -> float:
        return parse_time(self.created)

    @property
    def size_str(self) -> str:
        return human_size(self.size)

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "fingerprint": self.fingerprint, "created": self.created,
                "path": self.path, "files": self.file_count, "size": self.size,
                "objects": len(self.objects), "missing_objects": self.missing_objects}


@dataclass(frozen=True)
class EntryInfo:
    name: str
    manifests: tuple[ManifestInfo, ...]  # newest first
    ref: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ref": self.ref, "manifests": [m.to_dict() for m in self.manifests]}


@dataclass(frozen=True)
class StoreInfo:
    url: str
    entries: tuple[EntryInfo, ...]
    objects: tuple[ObjectInfo, ...]
    temp_files: tuple[tuple[str, float | None], ...]
    warnings: tuple[str, ...]
    damaged: tuple[str, ...] = ()  # manifests that do not parse: what they reference is unknown
    scanned_at: float = field(default_factory=time.time)

    @property
    def size_on_store(self) -> int:
        return sum(o.size for o in self.objects)

    @property
    def referenced(self) -> frozenset[str]:
        return frozenset().union(*(m.objects for e in self.entries for m in e.manifests))

    def to_dict(self) -> dict[str, Any]:
        referenced = self.referenced
        return {"store": self.url, "entries": [e.to_dict() for e in self.entries],
                "objects": len(self.objects), "size_on_store": self.size_on_store,
                "unreferenced_objects": sum(o.sha256 not in referenced for o in self.objects),
                "warnings": list(self.warnings)}

    def gc(self, keep: int = 2, min_age: float = DEFAULT_MIN_AGE) -> GcStrategy:
        return plan_gc(self, keep, min_age)


def _scan(store: Store) -> StoreInfo:
    warnings: list[str] = []
    objects, strays = store.list_objects()
    temp_files = []
    for path, mtime in strays.items():
        if is_temp_name(path):
            temp_files.append((path, mtime))
        else:
            warnings.append(f"{store.url_of(path)}: not a content-addressed object name")
    manifests, manifest_warnings, damaged = _scan_manifests(store, objects)
    warnings += manifest_warnings
    entries = []
    for name in sorted({m.entry for m in manifests} | set(_ref_names(store))):
        mine = sorted((m for m in manifests if m.entry == name),
                      key=lambda m: (m.created_ts, m.fingerprint), reverse=True)
        ref = store.read_ref(name)
        ref_fp = ref.get("fingerprint") if isinstance(ref, dict) else None
        if ref_fp and ref_fp not in {m.fingerprint for m in mine}:
            warnings.append(f"{store.url_of(store.ref_path(name))}: names {ref_fp}, which has no manifest")
        entries.append(EntryInfo(name, tuple(mine), ref_fp))
    return StoreInfo(store.url, tuple(entries), tuple(sorted(objects.values(), key=lambda o: o.sha256)),
                     tuple(temp_files), tuple(warnings), tuple(damaged))


def _ref_names(store: Store) -> list[str]:
    prefix = store._dir("refs") + "/"
    return [p[len(prefix):-len(".json")] for p in store.find("refs")
            if p.startswith(prefix) and p.endswith(".json") and "/" not in p[len(prefix):]]


def _scan_manifests(store: Store, objects: dict[str, ObjectInfo]
                    ) -> tuple[list[ManifestInfo], list[str], list[str]]:
    """(manifests, warnings, damaged): a damaged manifest is a message, only I/O failures raise."""
    found, damaged = store.load_manifests(sorted(store.find("manifests")))
    out, warnings = [], list(damaged)
    for path, manifest, _ in found:
        shas = frozenset(f.sha256 for f in manifest.files)
        missing = sum(1 for s in shas if s not in objects)
        if missing:
            warnings.append(f"{store.url_of(path)}: {missing} referenced object(s) missing from the store")
        out.append(ManifestInfo(manifest.entry, manifest.fingerprint, manifest.created, path,
                                len(manifest.files), manifest.total_size, shas, missing))
    return out, warnings, damaged


# --- gc -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GcReport:
    deleted_manifests: int = 0
    deleted_objects: int = 0
    deleted_temp_files: int = 0
    freed_size: int = 0
    spared_referenced: int = 0  # became referenced between plan and delete
    deferred_objects: int = 0  # a publish was in flight
    deferred_by: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"deleted_manifests": self.deleted_manifests, "deleted_objects": self.deleted_objects,
                "deleted_temp_files": self.deleted_temp_files, "freed_size": self.freed_size,
                "spared_referenced": self.spared_referenced, "deferred_objects": self.deferred_objects,
                "deferred_by": list(self.deferred_by)}


@dataclass(frozen=True)
class GcStrategy:
    """What gc would delete; ``execute`` is the only method with side effects."""

    keep: int
    min_age: float
    manifests_to_delete: tuple[ManifestInfo, ...]
    objects_to_delete: tuple[ObjectInfo, ...]
    objects_too_new: tuple[ObjectInfo, ...]
    temp_files_to_delete: tuple[str, ...]
    refs_to_rewrite: tuple[tuple[str, str | None], ...]  # (entry, newest kept fingerprint or None)
    warnings: tuple[str, ...] = ()

    @property
    def expected_freed_size(self) -> int:
        return sum(o.size for o in self.objects_to_delete)

    @property
    def expected_freed_size_str(self) -> str:
        return human_size(self.expected_freed_size)

    def to_dict(self) -> dict[str, Any]:
        return {"keep": self.keep, "min_age_seconds": self.min_age,
                "expected_freed_size": self.expected_freed_size,
                "manifests_to_delete": [m.to_dict() for m in self.manifests_to_delete],
                "objects_to_delete": [o.sha256 for o in self.objects_to_delete],
                "objects_too_new": len(self.objects_too_new),
                "temp_files_to_delete": list(self.temp_files_to_delete),
                "refs_to_rewrite": {e: fp for e, fp in self.refs_to_rewrite},
                "warnings": list(self.warnings)}

    def execute(self, store: Store) -> GcReport:
        return _execute_gc(self, store)


def plan_gc(info: StoreInfo, keep: int, min_age: float = DEFAULT_MIN_AGE) -> GcStrategy:
    if keep < 0:
        raise BadInput(f"gc --keep must be >= 0, got {keep}")
    doomed: list[ManifestInfo] = []
    refs: list[tuple[str, str | None]] = []
    kept_objects: set[str] = set()
    for entry in info.entries:
        kept, dropped = entry.manifests[:keep], entry.manifests[keep:]
        doomed.extend(dropped)
        kept_objects.update(*(m.objects for m in kept))
        newest = kept[0].fingerprint if kept else None
        if entry.ref != newest:
            refs.append((entry.name, newest))
    old_enough = lambda mtime: mtime is not None and info.scanned_at - mtime >= min_age  # noqa: E731
    unreferenced = [o for o in info.objects if o.sha256 not in kept_objects]
    warnings = info.warnings
    if info.damaged:  # they might name any object: delete none until someone repairs or removes them
        warnings += (f"gc deletes no objects while {len(info.damaged)} manifest(s) are unreadable",)
        unreferenced = []
    return GcStrategy(
        keep=keep, min_age=min_age, manifests_to_delete=tuple(doomed),
        objects_to_delete=tuple(o for o in unreferenced if old_enough(o.mtime)),
        objects_too_new=tuple(o for o in unreferenced if not old_enough(o.mtime)),
        temp_files_to_delete=tuple(p for p, mtime in info.temp_files if old_enough(mtime)),
        refs_to_rewrite=tuple(refs), warnings=warnings)


def _execute_gc(plan: GcStrategy, store: Store) -> GcReport:
    """Manifests first (a fetch then finds nothing rather than half), refs, then objects last."""
    with store.lock("gc") as marker:
        now = store.server_time(marker)
        store.delete([m.path for m in plan.manifests_to_delete])
        for entry, fingerprint in plan.refs_to_rewrite:
            _rewrite_ref(store, entry, fingerprint)
        publishing = store.live_locks("publish", now, store.publish_lease_ttl)
        if publishing:
            return GcReport(deleted_manifests=len(plan.manifests_to_delete),
                            deferred_objects=len(plan.objects_to_delete), deferred_by=tuple(publishing))
        current, _ = store.list_objects()
        referenced, damaged = _referenced_now(store, current)
        if damaged:
            return GcReport(deleted_manifests=len(plan.manifests_to_delete),
                            deferred_objects=len(plan.objects_to_delete), deferred_by=tuple(damaged))
        doomed = [o for o in plan.objects_to_delete
                  if o.sha256 not in referenced and _still_old(current.get(o.sha256), now, plan.min_age)]
        store.delete([store.object_path(o.sha256) for o in doomed] + list(plan.temp_files_to_delete))
        return GcReport(deleted_manifests=len(plan.manifests_to_delete), deleted_objects=len(doomed),
                        deleted_temp_files=len(plan.temp_files_to_delete),
                        freed_size=sum(o.size for o in doomed),
                        spared_referenced=sum(o.sha256 in referenced for o in plan.objects_to_delete))


def _still_old(obj: ObjectInfo | None, now: float, min_age: float) -> bool:
    return obj is not None and obj.mtime is not None and now - obj.mtime >= min_age


def _referenced_now(store: Store, objects: dict[str, ObjectInfo]) -> tuple[set[str], list[str]]:
    """Every object named by any manifest present now, including ones published since the plan."""
    manifests, _, damaged = _scan_manifests(store, objects)
    return set().union(*(m.objects for m in manifests)), damaged


def _rewrite_ref(store: Store, entry: str, fingerprint: str | None) -> None:
    if fingerprint is None:
        store.delete([store.ref_path(entry)])
        return
    manifest, _ = store.read_manifest(entry, fingerprint)
    store.write_ref(manifest)


# --- rendering ------------------------------------------------------------------------------------


def render_ls(info: StoreInfo, console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"aotc store {info.url}", title_justify="left")
    for column in ("entry", "fingerprint", "created", "files", "size", ""):
        table.add_column(column, justify="right" if column in ("files", "size") else "left")
    for entry in info.entries:
        for m in entry.manifests:
            marks = ["ref" if m.fingerprint == entry.ref else ""]
            if m.missing_objects:
                marks.append(f"[red]{m.missing_objects} missing[/red]")
            table.add_row(entry.name, m.fingerprint[:16], m.created, str(m.file_count), m.size_str,
                          " ".join(x for x in marks if x))
    console.print(table)
    console.print(f"{len(info.objects)} objects, {human_size(info.size_on_store)} on store")
    _print_warnings(info.warnings)


def render_gc(strategy: GcStrategy, dry_run: bool, console: Any, report: GcReport | None = None) -> None:
    verb = "would delete" if dry_run else "deleted"
    console.print(f"gc keep={strategy.keep}: {verb} {len(strategy.manifests_to_delete)} manifest(s), "
                  f"{len(strategy.objects_to_delete)} object(s) ({strategy.expected_freed_size_str})")
    for m in strategy.manifests_to_delete:
        console.print(f"  {m.entry} {m.fingerprint[:16]} {m.created}")
    if strategy.objects_too_new:
        console.print(f"  kept {len(strategy.objects_too_new)} unreferenced object(s) younger than "
                      f"{strategy.min_age:.0f}s (a publish may be about to reference them)")
    if report and report.deferred_by:
        console.print(f"  deferred {report.deferred_objects} object(s): "
                      f"{len(report.deferred_by)} publish(es) in progress")
    if report and report.spared_referenced:
        console.print(f"  spared {report.spared_referenced} object(s) referenced by a new manifest")
    _print_warnings(strategy.warnings)


def _print_warnings(warnings: Iterable[str]) -> None:
    for warning in warnings:
        print(f"aotc: warning: {warning}", file=sys.stderr)
