"""Fetch an artifact into the layout VLLM_XLA_CACHE_PATH expects, verified and placed atomically.

``dest`` ends up holding the artifact's ``cache/`` contents plus ``manifest.json``. Everything is written
into a fresh staging dir beside ``dest``; only when every object's size and sha256 matched does one
rename swap it in, so a previous ``dest`` survives any failure untouched. A ``dest`` that holds anything
but an earlier fetch is refused: fetch never deletes a user's files.

Every read is a ranged GET bounded by the manifest's size (the last one asks for one byte more, so a
stored object that grew is caught without reading it all); chunks are written where they belong and
hashed in order as they arrive, so there is no second read pass and little is buffered. A short body
(a 200 that stops early) or a wrong sha256 re-downloads that object, a bounded number of times. At most
``OPEN_OBJECTS`` objects are open at once, whatever the artifact's file count.

With a node cache (aotc/store/cache.py) each object is downloaded once per node and linked into dest;
what was linked is hashed unless its seal shows nothing changed it since it last was.
Waiting for another fetcher's lock on an object never blocks a thread: the wait polls, ends with the
fetch (an error elsewhere, the deadline), and gives up on a holder that is stopped, gone or makes no
progress, downloading the object itself. A cache that cannot be written (read-only, full) is gone around
with one warning: the store serves.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from aotc.errors import AotcError, BadInput, IntegrityError, NotFoundInStore
from aotc.files import OLD_SUFFIX, parse_time, recover_swap, remove_quietly, replace_dir, write_new
from aotc.manifest import MANIFEST_NAME, FileRecord, Manifest, check_relative_path
from aotc.store import SHA256_HEX, Meter, Store, check_name
from aotc.store.cache import NodeCache, place, unusable

DEFAULT_WORKERS = 16
CHUNK_SIZE = 16 << 20
WRITE_SLICE = 1 << 20  # bytes per pwrite + sha256 update (see ``_write_and_hash``)
ATTEMPTS = 3  # per object, for what the transport cannot see: a short body with 200, a bad sha
STAGING_MARK = ".aotc-staging-"
WRITERS = 4  # threads that create, write and hash files (hashlib and pwrite release the GIL)
OPEN_OBJECTS = 32  # objects open at once (each holds a file descriptor, two with a node cache)
DEFAULT_OPTIONAL_DEADLINE = 600.0  # fetch --optional gives up after this long unless --deadline says
LOCK_STALL = 60.0  # a node-cache lock whose holder shows no progress this long is gone around
LOCK_POLL = (0.002, 0.2)  # first and longest pause between tries of a held node-cache lock
ABANDON_GRACE = 2.0  # seconds an abandoned fetch thread gets to remove its own staging dir
logger = logging.getLogger(__name__)


class DeadlineExceeded(NotFoundInStore):
    """The store did not deliver in time: for a pod, the same as nothing being published (exit 3)."""


@dataclass(frozen=True)
class FetchResult:
    store: str
    entry: str
    fingerprint: str
    dest: str
    files: int
    size: int
    objects: int
    retried_objects: int
    seconds: float
    downloaded_size: int = 0  # object bytes that came from the store (not the node cache)
    cached_objects: int = 0  # objects served by the node cache
    cache_dir: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 3)
        return data


@dataclass(frozen=True)
class FetchOptions:
    """How a fetch runs; what it fetches (store, dest, entry or fingerprint) are ``fetch_artifact``'s own
    arguments."""

    progress: Any = None
    """An fsspec callback told the bytes as they arrive (the CLI's progress bar); None: silent."""
    workers: int = DEFAULT_WORKERS
    chunk_size: int = CHUNK_SIZE
    """Bytes per ranged read of a large object."""
    cache: NodeCache | None = None
    """The node-local object cache (aotc/store/cache.py); None: straight from the store."""
    deadline: float | None = None
    """Seconds the whole fetch may take (``fetch_before``); it also bounds how long a node-cache lock's
    silent holder is waited for."""


def fetch_artifact(url: str, dest: str, entry: Any = None, fingerprint: str | None = None,
                   options: FetchOptions = FetchOptions(), store: Store | None = None,
                   cancel: threading.Event | None = None) -> FetchResult:
    """``entry`` is a matrix entry (its fingerprint is computed for this environment) or None. ``cancel`` set
    before the swap leaves dest as it was (a caller that gave up, see ``fetch_before``)."""
    started = time.monotonic()
    cache = options.cache
    dest = real_dest(dest)
    recover_interrupted_swap(dest)  # first: even a fetch that fails next must not leave dest missing
    manifest = _cached_manifest(cache, entry, fingerprint)
    if manifest is None:
        store = store or Store.from_url(url)
        manifest, _ = resolve_manifest(store, entry, fingerprint)
    elif store is None and not cache.holds_all(manifest):  # type: ignore[union-attr]
        store = Store.from_url(url)
    # else: a fully warm node needs no store at all (nor gcsfs' import, seconds on a busy node)
    dest = prepare_dest(dest, manifest)
    meter = Meter(options.progress, manifest.total_size)
    keep = frozenset(f.sha256 for f in manifest.files)
    cache = _make_room(cache, manifest, keep)
    download, placed = None, False
    try:
        with _Staging(dest) as staging:
            download = _Download(store or _LazyStore(url), manifest, staging.path, meter, options.workers,
                                 options.chunk_size, cache, cancel, lock_stall(options.deadline))
            download.run()
            write_new(os.path.join(staging.path, MANIFEST_NAME), manifest.to_json().encode())
            if cancel is not None and cancel.is_set():
                raise DeadlineExceeded("fetch cancelled before placing the artifact")
            staging.swap_into_place()
            placed = True
    finally:
        meter.close()
        if cache is not None:
            _settle(cache, manifest if placed and download.cache else None, keep)
    return FetchResult(store=store.url if store else url, entry=manifest.entry, fingerprint=manifest.fingerprint, dest=dest,
                       files=len(manifest.files), size=manifest.total_size,
                       objects=len({f.sha256 for f in manifest.files}), retried_objects=download.retried,
                       seconds=time.monotonic() - started, downloaded_size=download.downloaded,
                       cached_objects=download.cached, cache_dir=cache.root if cache else None)


def lock_stall(deadline: float | None) -> float:
    """How long a node-cache lock's holder may show no progress: a quarter of a deadline at most."""
    return LOCK_STALL if deadline is None else min(LOCK_STALL, deadline / 4)


def _make_room(cache: NodeCache | None, manifest: Manifest, keep: frozenset[str]) -> NodeCache | None:
    """Evict before inserting (a cache a failed fetch filled must not stay full); None: go around it."""
    if cache is None:
        return None
    try:
        cache.evict(keep=keep, incoming=cache.missing_size(manifest))
    except OSError as exc:
        if not unusable(exc):
            raise
        warn_cache_unusable(cache, exc)
        return None
    return cache


def _settle(cache: NodeCache, manifest: Manifest | None, keep: frozenset[str]) -> None:
    """After a fetch, even a failed one: remember the manifest (None: it failed), evict, clean up."""
    try:
        if manifest is not None:
            cache.save_manifest(manifest)
        cache.evict(keep=keep)
    except OSError as exc:
        if not unusable(exc):
            raise
    finally:
        cache.close()


def warn_cache_unusable(cache: NodeCache, exc: OSError) -> None:
    logger.warning("node cache %s: %s; fetching from the store", cache.root, exc.strerror or exc)


def fetch_before(url: str, dest: str, entry: Any = None, fingerprint: str | None = None,
                 options: FetchOptions = FetchOptions()) -> FetchResult:
    """``fetch_artifact`` that gives up after ``options.deadline`` seconds with DeadlineExceeded.

    The fetch runs on a daemon thread; one that is stalled in the store's retries (or interrupted by a
    signal) is abandoned: told not to swap, its staging dir removed, so dest stays as it was. The caller
    should exit the process soon after (the abandoned thread's pools would otherwise be joined at exit).
    """
    cancel = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fetch_artifact(url, dest, entry, fingerprint, options, cancel=cancel)
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    worker = threading.Thread(target=run, name="aotc-fetch", daemon=True)
    worker.start()
    try:
        worker.join(min(options.deadline, threading.TIMEOUT_MAX))  # a longer wait (1e308 s) is a wait without end
    except BaseException:  # SIGTERM or Ctrl-C while waiting: the abandoned fetch leaves nothing behind
        abandon(worker, cancel, dest)
        raise
    if worker.is_alive():
        abandon(worker, cancel, dest)
        raise DeadlineExceeded(f"{url} did not deliver the artifact within the {options.deadline:g} s "
                               "deadline (fetch --deadline)")
    if "error" in box:
        raise box["error"]
    return box["result"]


def abandon(worker: threading.Thread, cancel: threading.Event, dest: str) -> None:
    """Tell a fetch thread not to swap, give it a moment to clean up after itself, then remove its staging
    dir here (a thread stalled in the store's retries never gets to): dest stays as it was."""
    cancel.set()
    worker.join(ABANDON_GRACE)
    remove_staging(dest)


# --- which manifest -------------------------------------------------------------------------------


def _cached_manifest(cache: NodeCache | None, entry: Any, fingerprint: str | None) -> Manifest | None:
    """A manifest this node fetched before: a store path is written once (create-only), so the copy is
    the store's manifest for that entry and fingerprint (verified when it was fetched)."""
    if cache is None:
        return None
    if entry is None:
        return cache.manifest_by_fingerprint(fingerprint) if fingerprint else None
    if fingerprint is None:
        from aotc.fingerprint import entry_kv_blocks, fingerprint_entry
        from aotc.kv import KvNotSized

        try:
            fingerprint = fingerprint_entry(entry, kv_blocks=entry_kv_blocks(entry, size=False)).digest
        except KvNotSized:
            return None  # the store says which page count was built (pod_fingerprint)
    return cache.manifest(entry.name, fingerprint)


class _LazyStore:
    """The store, opened on first use: a warm node cache may still miss an object evicted meanwhile."""

    def __init__(self, url: str):
        self.url, self._store = url, None

    def __getattr__(self, name: str) -> Any:
        if self._store is None:
            self._store = Store.from_url(self.url)
        return getattr(self._store, name)


def resolve_manifest(store: Store, entry: Any, fingerprint: str | None) -> tuple[Manifest, bytes]:
    if entry is not None and fingerprint is None:
        fp = pod_fingerprint(store, entry)
        try:
            return store.read_manifest(entry.name, fp.digest)
        except NotFoundInStore:
            raise NotFoundInStore(explain_missing(store, entry.name, fp.digest, fp.inputs)) from None
    if not fingerprint:
        raise BadInput("fetch needs an entry or a fingerprint")
    if entry is not None:
        return store.read_manifest(entry.name, fingerprint)
    return _by_fingerprint(store, fingerprint)


def pod_fingerprint(store: Store, entry: Any):
    """The fingerprint of the engine the pod runs. A page count its stack sizes on the pod's accelerator is
    not sized in an init container (neither the stack nor the accelerator is there): fetch takes the one the
    newest build of this entry, equal in every other input (else the newest at all, so that a miss names the
    inputs that differ, not the count), sized and published; the server pins that count and the guard names
    a server whose count differs."""
    from aotc.fingerprint import entry_kv_blocks, fingerprint_entry, fingerprint_inputs
    from aotc.kv import KvNotSized

    try:
        return fingerprint_entry(entry, kv_blocks=entry_kv_blocks(entry, size=False))
    except KvNotSized:
        pass
    unsized = fingerprint_inputs(entry, kv_blocks=None)
    found, _ = store.load_manifests(sorted(store.find(f"manifests/{check_name(entry.name, 'entry name')}")))
    published = [m for _, m, _ in found]
    built = [m for m in published if {**m.inputs, "kv_blocks": None} == unsized] or published
    sized = max(built, key=lambda m: parse_time(m.created)).inputs.get("kv_blocks") if built else None
    return fingerprint_entry(entry, kv_blocks=sized)


def _by_fingerprint(store: Store, fingerprint: str) -> tuple[Manifest, bytes]:
    try:
        check_name(fingerprint, "fingerprint")
    except IntegrityError as exc:
        raise BadInput(str(exc)) from exc
    paths = [p for p in store.find("manifests") if p.endswith(f"/{fingerprint}.json")]
    found, damaged = store.load_manifests(paths)
    if damaged and not found:
        raise IntegrityError(damaged[0][1])
    if not found:
        store.require()
        raise NotFoundInStore(f"no artifact with fingerprint {fingerprint} in {store.url}")
    _, manifest, data = max(found, key=lambda found: parse_time(found[1].created))
    return manifest, data


def explain_missing(store: Store, entry: str, digest: str, inputs: dict[str, Any]) -> str:
    """Name the inputs that differ from the nearest published manifest (fewest keys, newest on ties)."""
    head = f"no artifact for entry {entry} with fingerprint {digest[:16]} in {store.url}"
    found, _ = store.load_manifests(sorted(store.find(f"manifests/{check_name(entry, 'entry name')}")))
    published = [m for _, m, _ in found]
    if not published:
        return f"{head}: nothing is published for this entry"
    from aotc.fingerprint import describe_diff, diff_inputs

    diffs = [(diff_inputs(inputs, m.inputs), m) for m in published]
    keys, nearest = min(diffs, key=lambda d: (len(d[0]), -parse_time(d[1].created)))
    shown = "; ".join(describe_diff(inputs, nearest.inputs)[:8])
    more = f" (+{len(keys) - 8} more)" if len(keys) > 8 else ""
    return (f"{head}; the nearest published one, {nearest.fingerprint[:16]} ({nearest.created}), "
            f"differs in {len(keys)} input(s): {shown or 'none (the fingerprint scheme changed?)'}{more}")


# --- where it goes --------------------------------------------------------------------------------


def real_dest(dest: str) -> str:
    """``dest`` with every link resolved. A link to nothing on the way is refused: resolving it would create
    the link's target, wherever it points, outside the directory the user named."""
    if not dest or not dest.strip():
        raise BadInput("--dest is empty; name a directory for the artifact")
    path = os.path.abspath(dest)
    while not os.path.exists(path):  # below the first existing ancestor nothing exists, links included
        if os.path.islink(path):
            raise BadInput(f"--dest {dest}: {path} is a symlink to {os.readlink(path)}, which does not exist; "
                           "fetch does not create a link's target: name a real directory")
        if path == os.path.dirname(path):
            break
        path = os.path.dirname(path)
    return os.path.realpath(os.path.abspath(dest))


def prepare_dest(dest: str, manifest: Manifest) -> str:
    """Check every manifest path and ``dest`` (a ``real_dest``) before a byte moves."""
    parent = os.path.dirname(dest)
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise BadInput(f"{dest}: exists and is not a directory")
    check_layout(manifest)
    if os.path.isdir(dest):
        _refuse_links(dest, manifest)
        check_dest_is_ours(dest)
    os.makedirs(parent, exist_ok=True)
    return dest


def check_dest_is_ours(dest: str) -> None:
    """An existing dest is replaced whole, so it must be empty or an earlier fetch: a manifest.json
    that parses, and nothing beside it but the top-level names that manifest lists."""
    names = set(os.listdir(dest))
    if not names:
        return
    previous = _read_previous(os.path.join(dest, MANIFEST_NAME))
    ours = {MANIFEST_NAME} | {f.path.split("/")[0] for f in previous.files} if previous else set()
    strangers = sorted(names - ours)
    if strangers:
        shown = ", ".join(strangers[:3]) + (f" (+{len(strangers) - 3} more)" if len(strangers) > 3 else "")
        why = "holds files an earlier fetch did not write" if previous else "is not empty and not an earlier fetch"
        raise BadInput(f"{dest}: {why} ({shown}); fetch replaces its --dest whole, so it refuses: "
                       "use a new or empty directory")


def _read_previous(path: str) -> Manifest | None:
    if os.path.islink(path) or not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            return Manifest.from_json(f.read(64 << 20))
    except (OSError, IntegrityError):
        return None


def check_layout(manifest: Manifest) -> None:
    """Paths are plain, unique, never both a file and a directory, never our manifest.json."""
    files = {check_relative_path(f.path) for f in manifest.files}
    if len(files) != len(manifest.files):
        raise IntegrityError(f"manifest {manifest.fingerprint}: a path is listed twice")
    for path in files:
        if path.split("/")[0] == MANIFEST_NAME:
            raise IntegrityError(f"manifest {manifest.fingerprint}: path {path!r}: {MANIFEST_NAME!r} is reserved")
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in files:
                raise IntegrityError(f"manifest {manifest.fingerprint}: {path!r} goes through the file "
                                     f"{'/'.join(parts[:i])!r}")
    sizes: dict[str, int] = {}
    for f in manifest.files:
        if not SHA256_HEX.fullmatch(f.sha256):  # it becomes a store path: never let it climb out
            raise IntegrityError(f"manifest {manifest.fingerprint}: {f.path!r}: sha256 {f.sha256!r} is not hex")
        if sizes.setdefault(f.sha256, f.size) != f.size or f.size < 0:
            raise IntegrityError(f"manifest {manifest.fingerprint}: {f.path!r}: size {f.size} conflicts")


def _refuse_links(dest: str, manifest: Manifest) -> None:
    checked: set[str] = set()
    for f in manifest.files:
        parts = f.path.split("/")
        for i in range(1, len(parts) + 1):
            here = os.path.join(dest, *parts[:i])
            if here in checked:
                continue
            checked.add(here)
            if os.path.islink(here):
                raise IntegrityError(f"manifest path {f.path!r} would write through the link {here}")


def _staging_prefix(dest: str) -> str:
    return f".{os.path.basename(dest)}{STAGING_MARK}"


def recover_interrupted_swap(dest: str) -> None:
    """A kill between the fallback swap's two renames leaves dest missing and the previous copy at
    ``<staging>.old``: put it back (or drop it when the swap completed), before anything else. ``dest``: a
    ``real_dest``."""
    parent, prefix = os.path.dirname(dest), _staging_prefix(dest)
    if not os.path.isdir(parent):
        return
    asides = sorted((n for n in os.listdir(parent) if n.startswith(prefix) and n.endswith(OLD_SUFFIX)),
                    key=lambda n: os.lstat(os.path.join(parent, n)).st_mtime)
    for name in reversed(asides):  # the newest aside is the dest that was being replaced
        recover_swap(dest, os.path.join(parent, name))


def remove_staging(dest: str) -> None:
    """Every staging dir of ``dest`` (its asides, ``.old``, are ``recover_interrupted_swap``'s)."""
    if not dest or not dest.strip():
        return
    dest = os.path.realpath(os.path.abspath(dest))
    parent, prefix = os.path.dirname(dest), _staging_prefix(dest)
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix) and not name.endswith(OLD_SUFFIX):
            remove_tree(os.path.join(parent, name))


def remove_tree(path: str, attempts: int = 5) -> None:
    """``path`` gone, even while an interrupted writer still adds a file or two (a rmtree that raced one
    leaves its dir; once the dir is gone nothing can be created in it)."""
    for _ in range(attempts):
        if not os.path.lexists(path):
            return
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            remove_quietly(path)


class _Staging:
    """A fresh dir beside dest (same filesystem, so the final rename is atomic); removed on failure."""

    def __init__(self, dest: str):
        self.dest = dest
        self.parent = os.path.dirname(dest)
        self.path = ""

    def __enter__(self) -> _Staging:
        self._remove_leftovers()
        self.path = tempfile.mkdtemp(prefix=_staging_prefix(self.dest), dir=self.parent)
        os.chmod(self.path, 0o755)  # vLLM may run as another user than the init container
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.path:
            remove_tree(self.path)

    def _remove_leftovers(self) -> None:
        """Staging dirs of a killed fetch of this dest (concurrent fetches into one dest are unsupported);
        asides were resolved by ``recover_interrupted_swap`` already."""
        remove_staging(self.dest)

    def swap_into_place(self) -> None:
        try:
            replace_dir(self.path, self.dest)
        except OSError as exc:
            if exc.errno in (errno.EBUSY, errno.EXDEV):
                raise BadInput(f"{self.dest}: cannot be replaced by rename ({exc.strerror}); "
                               "is it a mount point? fetch into a subdirectory of it") from exc
            raise


# --- the download ---------------------------------------------------------------------------------


class _Retry(Exception):
    """This attempt at an object failed in a way a fresh download may fix."""


@dataclass
class _Object:
    sha256: str
    size: int
    paths: list[str]  # the first is downloaded (or linked from the cache), the others are copies


class _Download:
    """All objects at once, at most ``workers`` reads in flight, on the filesystem's own event loop.

    Per object, up to ``workers`` chunk reads run ahead while one consumer writes and hashes them in
    order on a small thread pool (hashlib and pwrite release the GIL), so the event loop only moves
    bytes. Sync filesystems (a local folder, memory://) run the same code with reads on threads.
    """

    def __init__(self, store: Store, manifest: Manifest, root: str, meter: Meter, workers: int, chunk: int,
                 cache: NodeCache | None = None, cancel: threading.Event | None = None,
                 lock_stall: float = LOCK_STALL):
        self.store, self.manifest, self.root, self.meter = store, manifest, root, meter
        self.workers, self.chunk = max(1, workers), max(1 << 20, chunk)
        self.ahead = self.workers  # chunk reads one object may run ahead of its writer
        self.cache, self.cancel, self.lock_stall = cache, cancel, lock_stall
        self._warned_bypass = False
        self.retried = self.cached = self.downloaded = 0
        fs = None if isinstance(store, _LazyStore) else store.fs  # lazy: run reads on threads if needed
        self._async = bool(getattr(fs, "async_impl", False)) and not getattr(fs, "asynchronous", False)

    def run(self) -> None:
        objects = self._plan()
        with ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="aotc-fetch-write") as self._writers, \
                ThreadPoolExecutor(max_workers=1 if self._async else self.workers,
                                   thread_name_prefix="aotc-fetch-read") as self._readers:
            if self._async:
                from fsspec.asyn import sync

                sync(self.store.fs.loop, self._all, objects)
            else:
                asyncio.run(self._all(objects))

    def _plan(self) -> list[_Object]:
        by_sha: dict[str, list[FileRecord]] = defaultdict(list)
        for f in self.manifest.files:
            by_sha[f.sha256].append(f)
        for directory in sorted({os.path.dirname(f.path) for f in self.manifest.files} - {""}):
            os.makedirs(os.path.join(self.root, directory), exist_ok=True)
        objects = []
        for sha, records in by_sha.items():
            paths = [os.path.join(self.root, r.path) for r in records]
            if records[0].size == 0:
                self._write_empty(sha, paths)
            else:
                objects.append(_Object(sha, records[0].size, paths))
        return sorted(objects, key=lambda o: -o.size)  # the longest first, so none starts last

    def _write_empty(self, sha: str, paths: list[str]) -> None:
        if hashlib.sha256(b"").hexdigest() != sha:
            raise IntegrityError(f"manifest {self.manifest.fingerprint}: {paths[0]} has size 0 "
                                 f"but sha256 {sha}")
        for path in paths:
            write_new(path, b"")

    async def _all(self, objects: list[_Object]) -> None:
        self._gate = asyncio.Semaphore(self.workers)
        self._open = asyncio.Semaphore(OPEN_OBJECTS)
        tasks = [asyncio.ensure_future(self._object(obj)) for obj in objects]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _object(self, obj: _Object) -> None:
        async with self._open:
            if self.cache is None:
                await self._download(obj, obj.paths[0])
            else:
                await self._through_cache(obj)
            for extra in obj.paths[1:]:
                await self._in(self._writers, shutil.copyfile, obj.paths[0], extra)

    async def _through_cache(self, obj: _Object) -> None:
        """Copy from the node cache, downloading into it first when it lacks the object (one fetcher
        per node per object: the others wait for its lock and then find it cached). A stuck holder or a
        cache that cannot be written is gone around: the object comes from the store."""
        cache = self.cache
        assert cache is not None
        try:
            lock = await self._cache_lock(obj)
            if lock is not None:
                try:
                    await self._serve_or_fill(cache, obj, lock)
                finally:
                    os.close(lock)
                return
        except OSError as exc:
            if not unusable(exc):
                raise
            if self.cache is not None:  # one warning; the other objects go around it too
                self.cache = None
                warn_cache_unusable(cache, exc)
        await self._download(obj, obj.paths[0])

    async def _serve_or_fill(self, cache: NodeCache, obj: _Object, lock: int) -> None:
        """Under the object's lock: download it into the cache if it is not there, then link it into
        dest. A sealed object whose link changed nothing else is served as is (a few syscalls, on the
        loop); otherwise what was linked is hashed, and a mismatch removes it and downloads it again."""
        filled = False
        for _ in range(ATTEMPTS):
            st = cache.lookup(obj.sha256, obj.size, lock)
            if st is None:
                await self._fill(cache, obj, lock)
                filled = True
                continue
            sealed = cache.sealed(obj.sha256, st, lock)
            try:  # a link is two syscalls: on the loop; a copy (another filesystem) is not
                _replace_with_link(cache.path(obj.sha256), obj.paths[0], copy=False)
            except OSError:
                await self._in(self._writers, _replace_with_link, cache.path(obj.sha256), obj.paths[0])
            if (sealed and cache.reseal_after_link(obj.sha256, st, lock)) or \
                    await self._in(self._writers, cache.verify_linked, obj.sha256, obj.size, obj.paths[0], lock):
                if not filled:
                    self.cached += 1
                    self.meter.add(obj.size)
                return
            cache.discard(obj.sha256)
        raise IntegrityError(f"node cache {cache.root}: object {obj.sha256} ({self._name(obj)}) keeps changing "
                             f"after it is placed (after {ATTEMPTS} attempts)")

    async def _fill(self, cache: NodeCache, obj: _Object, lock: int) -> None:
        """Download into the cache (hashed while it streams), then give it its name."""
        temp = cache.new_temp()
        cache.mark_holder(lock, temp)
        try:
            await self._download(obj, temp)
            await self._in(self._writers, cache.insert, temp, obj.sha256, lock)
        finally:
            await self._in(self._writers, remove_quietly, temp)

    async def _cache_lock(self, obj: _Object) -> int | None:
        """The object's node-cache lock, or None: its holder is stuck, so go around the cache. The wait
        polls on the loop (no thread sits in flock), so it ends with the fetch: its error or deadline."""
        cache = self.cache
        assert cache is not None
        lock = cache.try_lock(obj.sha256)
        pause, seen, since = LOCK_POLL[0], None, time.monotonic()
        while lock is None:
            if self.cancel is not None and self.cancel.is_set():
                raise DeadlineExceeded("fetch cancelled while waiting for a node-cache lock")
            progress, now = cache.holder_progress(obj.sha256), time.monotonic()
            if progress != seen:
                seen, since = progress, now
            why = cache.stuck(progress) or (f"its holder made no progress for {now - since:.0f} s"
                                            if now - since >= self.lock_stall else None)
            if why:
                self._warn_bypass(obj, why)
                return None
            await asyncio.sleep(pause)
            pause = min(pause * 2, LOCK_POLL[1])
            lock = cache.try_lock(obj.sha256)
        return lock

    def _warn_bypass(self, obj: _Object, why: str) -> None:
        if not self._warned_bypass:  # once per fetch: a stuck fetcher may hold many locks
            self._warned_bypass = True
            logger.warning("node cache: the lock on %s (%s) is held and %s; downloading it directly",
                           obj.sha256[:16], self._name(obj), why)

    async def _download(self, obj: _Object, target: str) -> None:
        for attempt in range(1, ATTEMPTS + 1):
            failure = await self._attempt(obj, target)
            if failure is None:
                self.downloaded += obj.size
                return
            if attempt == ATTEMPTS:
                raise IntegrityError(f"{failure} (after {attempt} attempts)")
            self.retried += 1

    async def _attempt(self, obj: _Object, target: str) -> str | None:
        """Download once into ``target``; the reason it must be retried, or None when it verified."""
        try:
            if obj.size <= self.chunk:  # one range: one hop to a writer creates, writes, hashes and closes
                digest = await self._in(self._writers, _write_file, target, await self._read(obj, 0, obj.size))
                self.meter.add(obj.size)
            else:
                digest = await self._stream(obj, target)
        except _Retry as exc:
            return str(exc)
        if digest != obj.sha256:
            self.meter.add(-obj.size)
            return (f"{self.store.url_of(self.store.object_path(obj.sha256))} ({self._name(obj)}): "
                    f"sha256 is {digest}, the manifest says {obj.sha256}")
        return None

    async def _stream(self, obj: _Object, target: str) -> str:
        """Ranges read ahead, written and hashed in order on the writer threads: the sha256 written."""
        fd = await self._in(self._writers, _create, target)
        hasher, written = hashlib.sha256(), 0
        ranges = iter([(o, min(self.chunk, obj.size - o)) for o in range(0, obj.size, self.chunk)])
        ahead: deque[tuple[int, asyncio.Future]] = deque()
        try:
            while True:
                while len(ahead) < self.ahead and (nxt := next(ranges, None)):
                    ahead.append((nxt[0], asyncio.ensure_future(self._read(obj, *nxt))))
                if not ahead:
                    return hasher.hexdigest()
                offset, pending = ahead.popleft()
                data = await pending
                await self._in(self._writers, _write_and_hash, fd, offset, data, hasher)
                written += len(data)
                self.meter.add(len(data))
        except _Retry:
            self.meter.add(-written)
            raise
        finally:
            for _, pending in ahead:
                pending.cancel()
            await asyncio.gather(*(p for _, p in ahead), return_exceptions=True)
            os.close(fd)

    async def _read(self, obj: _Object, offset: int, n: int) -> bytes:
        """Bytes [offset, offset + n); the last range asks for one byte more, to catch a grown object."""
        path = self.store.object_path(obj.sha256)
        last = offset + n == obj.size
        try:
            async with self._gate:
                data = await self._range(path, offset, offset + n + (1 if last else 0))
        except FileNotFoundError:
            raise NotFoundInStore(f"object {self.store.url_of(path)} ({self._name(obj)}) is missing "
                                  "from the store") from None
        except (AotcError, asyncio.CancelledError):
            raise
        except Exception as exc:
            await self._check_size(obj, path)
            raise OSError(f"{self.store.url_of(path)}: {type(exc).__name__}: {exc}") from exc
        if len(data) > n:
            raise IntegrityError(f"{self.store.url_of(path)} ({self._name(obj)}): stored object is larger "
                                 f"than the {obj.size} bytes the manifest says (replaced)")
        if len(data) != n:
            await self._check_size(obj, path)
            raise _Retry(f"{self.store.url_of(path)}: got {len(data)} bytes at offset {offset}, wanted {n}")
        return data

    async def _range(self, path: str, start: int, end: int) -> bytes:
        if self._async:
            return await self.store.fs._cat_file(path, start=start, end=end)
        return await self._in(self._readers, self.store.read, path, start, end)

    async def _check_size(self, obj: _Object, path: str) -> None:
        """A stored object shorter than the manifest says is an integrity error, not a network one."""
        try:
            if self._async:
                info = await self.store.fs._info(path)
            else:
                info = await self._in(self._readers, self.store.fs.info, path)
            size = int(info.get("size", -1))
        except FileNotFoundError:
            raise NotFoundInStore(f"object {self.store.url_of(path)} is missing from the store") from None
        if size != obj.size:
            raise IntegrityError(f"{self.store.url_of(path)} ({self._name(obj)}): stored object is {size} "
                                 f"bytes, the manifest says {obj.size} (truncated or replaced)")

    @staticmethod
    async def _in(pool: ThreadPoolExecutor, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args, **kwargs))

    def _name(self, obj: _Object) -> str:
        return os.path.relpath(obj.paths[0], self.root)


def _replace_with_link(source: str, target: str, copy: bool = True) -> None:
    remove_quietly(target)  # an earlier attempt's, whose bytes had changed
    if copy:
        place(source, target)
    else:
        os.link(source, target)


def _create(path: str) -> int:
    """A fresh regular file: never through a link, never someone else's file (O_EXCL)."""
    if os.path.lexists(path):  # our own earlier attempt
        os.unlink(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)


def _write_file(path: str, data: bytes) -> str:
    fd = _create(path)
    try:
        hasher = hashlib.sha256()
        _write_and_hash(fd, 0, data, hasher)
    finally:
        os.close(fd)
    return hasher.hexdigest()


def _write_and_hash(fd: int, offset: int, data: bytes, hasher: Any) -> None:
    """A slice at a time, so sha256 reads each slice from the CPU cache the write just filled (measured:
    fetch client CPU -5 %, wall -3..7 % over 1.1 GB against whole-chunk write-then-hash)."""
    view = memoryview(data)
    for start in range(0, len(view), WRITE_SLICE):
        piece, done = view[start:start + WRITE_SLICE], 0
        while done < len(piece):
            done += os.pwrite(fd, piece[done:], offset + start + done)
        hasher.update(piece)

