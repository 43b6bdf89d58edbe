"""Download and verify an artifact's objects from the store into the staging dir.

Every read is a ranged GET bounded by the manifest's size (the last one asks for one byte more, so a
stored object that grew is caught without reading it all); chunks are written where they belong and
hashed in order as they arrive, so there is no second read pass and little is buffered. A short body
(a 200 that stops early) or a wrong sha256 re-downloads that object, a bounded number of times. At most
``OPEN_OBJECTS`` objects are open at once, whatever the artifact's file count. Through the node cache:
aotc/fetch_node_cache.py.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import shutil
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aotc.errors import AotcError, IntegrityError, NotFoundInStore
from aotc.files import write_new
from aotc.manifest import FileRecord, Manifest
from aotc.store import Meter, Store

DEFAULT_WORKERS = 16
CHUNK_SIZE = 16 << 20
WRITE_SLICE = 1 << 20  # bytes per pwrite + sha256 update (see ``_write_and_hash``)
ATTEMPTS = 3  # per object, for what the transport cannot see: a short body with 200, a bad sha
WRITERS = 4  # threads that create, write and hash files (hashlib and pwrite release the GIL)
OPEN_OBJECTS = 32  # objects open at once (each holds a file descriptor, two with a node cache)


class LazyStore:
    """The store, opened on first use: a warm node cache may still miss an object evicted meanwhile."""

    def __init__(self, url: str):
        self.url, self._store = url, None

    def __getattr__(self, name: str) -> Any:
        if self._store is None:
            self._store = Store.from_url(self.url)
        return getattr(self._store, name)


class _Retry(Exception):
    """This attempt at an object failed in a way a fresh download may fix."""


@dataclass
class StoreObject:
    sha256: str
    size: int
    paths: list[str]  # the first is downloaded (or linked from the cache), the others are copies


class Download:
    """All objects at once, at most ``workers`` reads in flight, on the filesystem's own event loop.

    Per object, up to ``workers`` chunk reads run ahead while one consumer writes and hashes them in
    order on a small thread pool (hashlib and pwrite release the GIL), so the event loop only moves
    bytes. Sync filesystems (a local folder, memory://) run the same code with reads on threads.
    """

    def __init__(self, store: Store, manifest: Manifest, root: str, meter: Meter, workers: int, chunk: int):
        self.store, self.manifest, self.root, self.meter = store, manifest, root, meter
        self.workers, self.chunk = max(1, workers), max(1 << 20, chunk)
        self.ahead = self.workers  # chunk reads one object may run ahead of its writer
        self.retried_objects = self.cached_objects = self.downloaded_size = 0
        fs = None if isinstance(store, LazyStore) else store.fs  # lazy: run reads on threads if needed
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

    def _plan(self) -> list[StoreObject]:
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
                objects.append(StoreObject(sha, records[0].size, paths))
        return sorted(objects, key=lambda o: -o.size)  # the longest first, so none starts last

    def _write_empty(self, sha: str, paths: list[str]) -> None:
        if hashlib.sha256(b"").hexdigest() != sha:
            raise IntegrityError(f"manifest {self.manifest.fingerprint}: {paths[0]} has size 0 "
                                 f"but sha256 {sha}")
        for path in paths:
            write_new(path, b"")

    async def _all(self, objects: list[StoreObject]) -> None:
        self._gate = asyncio.Semaphore(self.workers)
        self._open = asyncio.Semaphore(OPEN_OBJECTS)
        tasks = [asyncio.ensure_future(self._object(obj)) for obj in objects]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _object(self, obj: StoreObject) -> None:
        async with self._open:
            await self._first_copy(obj)
            for extra in obj.paths[1:]:
                await self._in(self._writers, shutil.copyfile, obj.paths[0], extra)

    async def _first_copy(self, obj: StoreObject) -> None:
        """The object at its first path (``ThroughNodeCache`` takes it from the node cache)."""
        await self._download(obj, obj.paths[0])

    async def _download(self, obj: StoreObject, target: str) -> None:
        for attempt in range(1, ATTEMPTS + 1):
            failure = await self._attempt(obj, target)
            if failure is None:
                self.downloaded_size += obj.size
                return
            if attempt == ATTEMPTS:
                raise IntegrityError(f"{failure} (after {attempt} attempts)")
            self.retried_objects += 1

    async def _attempt(self, obj: StoreObject, target: str) -> str | None:
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

    async def _stream(self, obj: StoreObject, target: str) -> str:
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

    async def _read(self, obj: StoreObject, offset: int, n: int) -> bytes:
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

    async def _check_size(self, obj: StoreObject, path: str) -> None:
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

    def _name(self, obj: StoreObject) -> str:
        return os.path.relpath(obj.paths[0], self.root)


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
