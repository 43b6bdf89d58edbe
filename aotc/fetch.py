"""Fetch an artifact into the layout VLLM_XLA_CACHE_PATH expects, verified and placed atomically.

``dest`` ends up holding the artifact's ``cache/`` contents plus ``manifest.json``. Everything is written
into a fresh staging dir beside ``dest``; only when every object's size and sha256 matched does one
rename swap it in, so a previous ``dest`` survives any failure untouched.

Small objects are one GET, large ones parallel ranged GETs; every chunk is written where it belongs and
hashed in order as it arrives, so there is no second read pass and little is buffered. A short body
(a 200 that stops early) or a wrong sha256 re-downloads that object, a bounded number of times.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import functools
import hashlib
import os
import shutil
import tempfile
import time
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from aotc.errors import AotcError, BadInput, IntegrityError, NotFoundInStore
from aotc.manifest import MANIFEST_NAME, FileRecord, Manifest, check_relative_path
from aotc.store import (
    SHA256_HEX,
    Meter,
    Store,
    check_name,
    human_size,
    parse_time,
    progress_callback,
)

DEFAULT_WORKERS = 16
CHUNK_SIZE = 16 << 20
ATTEMPTS = 3  # per object, for what the transport cannot see: a short body with 200, a bad sha
STAGING_MARK = ".aotc-staging-"
WRITERS = 4  # threads that create, write and hash files (hashlib and pwrite release the GIL)


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

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 3)
        return data


def fetch_artifact(url: str, dest: str, entry: Any = None, fingerprint: str | None = None,
                   progress: bool = False, callback: Any = None, workers: int = DEFAULT_WORKERS,
                   chunk_size: int = CHUNK_SIZE, store: Store | None = None) -> FetchResult:
    """``entry`` is a matrix entry (its fingerprint is computed for this environment) or None."""
    started = time.monotonic()
    store = store or Store.from_url(url)
    manifest, data = resolve_manifest(store, entry, fingerprint)
    dest = prepare_dest(dest, manifest)
    meter = Meter(callback or progress_callback(progress, f"fetch {manifest.entry}"), manifest.total_size)
    try:
        with _Staging(dest) as staging:
            retried = _Download(store, manifest, staging.path, meter, workers, chunk_size).run()
            _write_new(os.path.join(staging.path, MANIFEST_NAME), data)
            staging.swap_into_place()
    finally:
        meter.close()
    return FetchResult(store=store.url, entry=manifest.entry, fingerprint=manifest.fingerprint, dest=dest,
                       files=len(manifest.files), size=manifest.total_size,
                       objects=len({f.sha256 for f in manifest.files}), retried_objects=retried,
                       seconds=time.monotonic() - started)


# --- which manifest -------------------------------------------------------------------------------


def resolve_manifest(store: Store, entry: Any, fingerprint: str | None) -> tuple[Manifest, bytes]:
    if entry is not None and fingerprint is None:
        from aotc.fingerprint import fingerprint_entry

        fp = fingerprint_entry(entry)
        try:
            return store.read_manifest(entry.name, fp.digest)
        except NotFoundInStore:
            raise NotFoundInStore(explain_missing(store, entry.name, fp.digest, fp.inputs)) from None
    if not fingerprint:
        raise BadInput("fetch needs an entry or a fingerprint")
    if entry is not None:
        return store.read_manifest(entry.name, fingerprint)
    return _by_fingerprint(store, fingerprint)


def _by_fingerprint(store: Store, fingerprint: str) -> tuple[Manifest, bytes]:
    try:
        check_name(fingerprint, "fingerprint")
    except IntegrityError as exc:
        raise BadInput(str(exc)) from exc
    paths = [p for p in store.find("manifests") if p.endswith(f"/{fingerprint}.json")]
    found, damaged = store.load_manifests(paths)
    if damaged and not found:
        raise IntegrityError(damaged[0])
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


def prepare_dest(dest: str, manifest: Manifest) -> str:
    """Check every manifest path against ``dest`` before a byte moves; return the real dest path."""
    dest = os.path.realpath(os.path.abspath(dest))
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise BadInput(f"{dest}: exists and is not a directory")
    check_layout(manifest)
    if os.path.isdir(dest):
        _refuse_links(dest, manifest)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    return dest


def check_layout(manifest: Manifest) -> None:
    """Paths are plain, unique, never both a file and a directory, never our manifest.json."""
    files = {check_relative_path(f.path) for f in manifest.files}
    if len(files) != len(manifest.files):
        raise IntegrityError(f"manifest {manifest.fingerprint}: a path is listed twice")
    if MANIFEST_NAME in files:
        raise IntegrityError(f"manifest {manifest.fingerprint}: path {MANIFEST_NAME!r} is reserved")
    for path in files:
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


class _Staging:
    """A fresh dir beside dest (same filesystem, so the final rename is atomic); removed on failure."""

    def __init__(self, dest: str):
        self.dest = dest
        self.parent, self.name = os.path.split(dest)
        self.path = ""

    def __enter__(self) -> _Staging:
        self._remove_leftovers()
        self.path = tempfile.mkdtemp(prefix=f".{self.name}{STAGING_MARK}", dir=self.parent)
        os.chmod(self.path, 0o755)  # vLLM may run as another user than the init container
        return self

    def __exit__(self, *exc: Any) -> None:
        if os.path.lexists(self.path):
            shutil.rmtree(self.path, ignore_errors=True)

    def _remove_leftovers(self) -> None:
        """Staging dirs of a killed fetch of this dest (concurrent fetches into one dest are unsupported)."""
        prefix = f".{self.name}{STAGING_MARK}"
        for name in os.listdir(self.parent):
            if name.startswith(prefix):
                shutil.rmtree(os.path.join(self.parent, name), ignore_errors=True)

    def swap_into_place(self) -> None:
        try:
            if not os.path.lexists(self.dest):
                os.rename(self.path, self.dest)
            elif not _exchange(self.path, self.dest):
                aside = f"{self.path}.old"
                os.rename(self.dest, aside)
                os.rename(self.path, self.dest)
                self.path = aside
        except OSError as exc:
            if exc.errno in (errno.EBUSY, errno.EXDEV):
                raise BadInput(f"{self.dest}: cannot be replaced by rename ({exc.strerror}); "
                               "is it a mount point? fetch into a subdirectory of it") from exc
            raise
        # self.path now holds the previous dest (or nothing); __exit__ removes it


def _exchange(a: str, b: str) -> bool:
    """renameat2(RENAME_EXCHANGE): swap two dirs in one step, so dest never disappears (Linux)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), b)


def _write_new(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


# --- the download ---------------------------------------------------------------------------------


class _Retry(Exception):
    """This attempt at an object failed in a way a fresh download may fix."""


@dataclass
class _Object:
    sha256: str
    size: int
    paths: list[str]  # the first is downloaded, the others are copies (same content, other names)


class _Download:
    """All objects at once, at most ``workers`` reads in flight, on the filesystem's own event loop.

    Per object, up to ``workers`` chunk reads run ahead while one consumer writes and hashes them in
    order on a small thread pool (hashlib and pwrite release the GIL), so the event loop only moves
    bytes. Sync filesystems (a local folder, memory://) run the same code with reads on threads.
    """

    def __init__(self, store: Store, manifest: Manifest, root: str, meter: Meter, workers: int, chunk: int):
        self.store, self.manifest, self.root, self.meter = store, manifest, root, meter
        self.workers, self.chunk = max(1, workers), max(1 << 20, chunk)
        self.ahead = self.workers  # chunk reads one object may run ahead of its writer
        self.retried = 0
        fs = store.fs
        self._async = bool(getattr(fs, "async_impl", False)) and not getattr(fs, "asynchronous", False)

    def run(self) -> int:
        objects = self._plan()
        with ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="aotc-fetch-write") as self._writers, \
                ThreadPoolExecutor(max_workers=1 if self._async else self.workers,
                                   thread_name_prefix="aotc-fetch-read") as self._readers:
            if self._async:
                from fsspec.asyn import sync

                sync(self.store.fs.loop, self._all, objects)
            else:
                asyncio.run(self._all(objects))
        return self.retried

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
            _write_new(path, b"")

    async def _all(self, objects: list[_Object]) -> None:
        self._gate = asyncio.Semaphore(self.workers)
        tasks = [asyncio.ensure_future(self._object(obj)) for obj in objects]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _object(self, obj: _Object) -> None:
        for attempt in range(1, ATTEMPTS + 1):
            failure = await self._attempt(obj)
            if failure is None:
                for extra in obj.paths[1:]:
                    await self._in(self._writers, shutil.copyfile, obj.paths[0], extra)
                return
            if attempt == ATTEMPTS:
                raise IntegrityError(f"{failure} (after {attempt} attempts)")
            self.retried += 1

    async def _attempt(self, obj: _Object) -> str | None:
        """Download once into paths[0]; the reason it must be retried, or None when it verified."""
        fd = await self._in(self._writers, _create, obj.paths[0])  # slow on some disks: off the loop
        hasher, written = hashlib.sha256(), 0
        ranges = iter([(o, min(self.chunk, obj.size - o)) for o in range(0, obj.size, self.chunk)])
        ahead: deque[tuple[int, asyncio.Future]] = deque()
        try:
            while True:
                while len(ahead) < self.ahead and (nxt := next(ranges, None)):
                    ahead.append((nxt[0], asyncio.ensure_future(self._read(obj, *nxt))))
                if not ahead:
                    break
                offset, pending = ahead.popleft()
                data = await pending
                await self._in(self._writers, _write_and_hash, fd, offset, data, hasher)
                written += len(data)
                self.meter.add(len(data))
        except _Retry as exc:
            self.meter.add(-written)
            return str(exc)
        finally:
            for _, pending in ahead:
                pending.cancel()
            await asyncio.gather(*(p for _, p in ahead), return_exceptions=True)
            os.close(fd)
        if hasher.hexdigest() != obj.sha256:
            self.meter.add(-written)
            return (f"{self.store.url_of(self.store.object_path(obj.sha256))} ({self._name(obj)}): "
                    f"sha256 is {hasher.hexdigest()}, the manifest says {obj.sha256}")
        return None

    async def _read(self, obj: _Object, offset: int, n: int) -> bytes:
        path = self.store.object_path(obj.sha256)
        whole = n == obj.size
        try:
            async with self._gate:
                data = await self._fs("cat_file", path, start=None if whole else offset,
                                      end=None if whole else offset + n)
        except FileNotFoundError:
            raise NotFoundInStore(f"object {self.store.url_of(path)} ({self._name(obj)}) is missing "
                                  "from the store") from None
        except (AotcError, asyncio.CancelledError):
            raise
        except Exception as exc:
            await self._check_size(obj, path)
            raise OSError(f"{self.store.url_of(path)}: {type(exc).__name__}: {exc}") from exc
        if len(data) != n:
            await self._check_size(obj, path)
            raise _Retry(f"{self.store.url_of(path)}: got {len(data)} bytes at offset {offset}, wanted {n}")
        return data

    async def _check_size(self, obj: _Object, path: str) -> None:
        """A stored object shorter than the manifest says is an integrity error, not a network one."""
        try:
            size = int((await self._fs("info", path)).get("size", -1))
        except FileNotFoundError:
            raise NotFoundInStore(f"object {self.store.url_of(path)} is missing from the store") from None
        if size != obj.size:
            raise IntegrityError(f"{self.store.url_of(path)} ({self._name(obj)}): stored object is {size} "
                                 f"bytes, the manifest says {obj.size} (truncated or replaced)")

    async def _fs(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The async form of an fsspec call on async filesystems, else the sync one on a thread."""
        if self._async:
            return await getattr(self.store.fs, f"_{method}")(*args, **kwargs)
        return await self._in(self._readers, getattr(self.store.fs, method), *args, **kwargs)

    @staticmethod
    async def _in(pool: ThreadPoolExecutor, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args, **kwargs))

    def _name(self, obj: _Object) -> str:
        return os.path.relpath(obj.paths[0], self.root)


def _create(path: str) -> int:
    """A fresh regular file: never through a link, never someone else's file (O_EXCL)."""
    if os.path.lexists(path):  # our own earlier attempt
        os.unlink(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)


def _write_and_hash(fd: int, offset: int, data: bytes, hasher: Any) -> None:
    view, done = memoryview(data), 0
    while done < len(data):
        done += os.pwrite(fd, view[done:], offset + done)
    hasher.update(data)


def render_fetch(result: FetchResult, console: Any) -> None:
    rate = result.size / result.seconds if result.seconds > 0 else 0.0
    retried = f", {result.retried_objects} object(s) re-downloaded" if result.retried_objects else ""
    console.print(f"fetched {result.entry} {result.fingerprint[:16]} → {result.dest}: {result.files} files, "
                  f"{human_size(result.size)} in {result.seconds:.1f}s ({human_size(int(rate))}/s){retried}")
