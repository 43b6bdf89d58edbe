"""A fetch through the node cache (aotc/store/cache.py): each object is downloaded once per node and linked
into dest; what was linked is hashed unless its seal shows nothing changed it since it last was.
Waiting for another fetcher's lock on an object never blocks a thread: the wait polls, ends with the
fetch (an error elsewhere, the deadline), and gives up on a holder that is stopped, gone or makes no
progress, downloading the object itself. A cache that cannot be written (read-only, full) is gone around
with one warning: the store serves.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from aotc.errors import DeadlineExceeded, IntegrityError
from aotc.fetch_dest import Cancel
from aotc.fetch_download import ATTEMPTS, Download, StoreObject
from aotc.files import remove_quietly
from aotc.manifest import Manifest
from aotc.store import Meter, Store
from aotc.store.cache import NodeCache, place, unusable

LOCK_STALL = 60.0  # a node-cache lock whose holder shows no progress this long is gone around
LOCK_POLL = (0.002, 0.2)  # first and longest pause between tries of a held node-cache lock
logger = logging.getLogger(__name__)


def lock_stall_for(deadline: float | None) -> float:
    """How long a node-cache lock's holder may show no progress: a quarter of a deadline at most."""
    return LOCK_STALL if deadline is None else min(LOCK_STALL, deadline / 4)


def make_room(cache: NodeCache | None, manifest: Manifest, keep: frozenset[str]) -> NodeCache | None:
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


def settle(cache: NodeCache, manifest: Manifest | None, keep: frozenset[str]) -> None:
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


class ThroughNodeCache(Download):
    """``Download`` whose objects come from the node cache, filled from the store when it lacks one."""

    def __init__(self, store: Store, manifest: Manifest, root: str, meter: Meter, workers: int, chunk: int,
                 cache: NodeCache, cancel: Cancel | None = None, lock_stall: float = LOCK_STALL):
        super().__init__(store, manifest, root, meter, workers, chunk)
        self.cache: NodeCache | None = cache  # None once it proved unusable: the store serves the rest
        self.cancel, self.lock_stall = cancel, lock_stall
        self._warned_bypass = False

    async def _first_copy(self, obj: StoreObject) -> None:
        if self.cache is None:
            await self._download(obj, obj.paths[0])
        else:
            await self._through_cache(obj)

    async def _through_cache(self, obj: StoreObject) -> None:
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

    async def _serve_or_fill(self, cache: NodeCache, obj: StoreObject, lock: int) -> None:
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
                    self.cached_objects += 1
                    self.meter.add(obj.size)
                return
            cache.discard(obj.sha256)
        raise IntegrityError(f"node cache {cache.root}: object {obj.sha256} ({self._name(obj)}) keeps changing "
                             f"after it is placed (after {ATTEMPTS} attempts)")

    async def _fill(self, cache: NodeCache, obj: StoreObject, lock: int) -> None:
        """Download into the cache (hashed while it streams), then give it its name."""
        temp = cache.new_temp()
        cache.mark_holder(lock, temp)
        try:
            await self._download(obj, temp)
            await self._in(self._writers, cache.insert, temp, obj.sha256, lock)
        finally:
            await self._in(self._writers, remove_quietly, temp)

    async def _cache_lock(self, obj: StoreObject) -> int | None:
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

    def _warn_bypass(self, obj: StoreObject, why: str) -> None:
        if not self._warned_bypass:  # once per fetch: a stuck fetcher may hold many locks
            self._warned_bypass = True
            logger.warning("node cache: the lock on %s (%s) is held and %s; downloading it directly",
                           obj.sha256[:16], self._name(obj), why)


def _replace_with_link(source: str, target: str, copy: bool = True) -> None:
    remove_quietly(target)  # an earlier attempt's, whose bytes had changed
    if copy:
        place(source, target)
    else:
        os.link(source, target)
