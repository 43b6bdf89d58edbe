"""Fetch an artifact into the layout VLLM_XLA_CACHE_PATH expects, verified and placed atomically.

``dest`` ends up holding the artifact's ``cache/`` contents plus ``manifest.json``. Everything is written
into a fresh staging dir beside ``dest``; only when every object's size and sha256 matched does one
rename swap it in, so a previous ``dest`` survives any failure untouched.

The parts: which manifest (aotc/fetch_manifest.py), where it goes (aotc/fetch_dest.py), the download
and its checks (aotc/fetch_download.py), the node cache (aotc/fetch_node_cache.py). Here: one fetch
from start to end, and the deadline a pod's init container gives it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from aotc.errors import DeadlineExceeded
from aotc.fetch_dest import Cancel, Staging, prepare_dest, real_dest, recover_interrupted_swap, remove_staging
from aotc.fetch_download import CHUNK_SIZE, DEFAULT_WORKERS, Download, LazyStore
from aotc.fetch_manifest import cached_manifest, resolve_manifest
from aotc.fetch_node_cache import ThroughNodeCache, lock_stall_for, make_room, settle
from aotc.files import write_new
from aotc.manifest import MANIFEST_NAME, Manifest
from aotc.store import Meter, Store
from aotc.store.cache import NodeCache

DEFAULT_OPTIONAL_DEADLINE = 600.0  # fetch --optional gives up after this long unless --deadline says
ABANDON_GRACE = 2.0  # seconds an abandoned fetch thread gets to remove its own staging dir


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
                   cancel: Cancel | None = None) -> FetchResult:
    """``entry`` is a matrix entry (its fingerprint is computed for this environment) or None. ``cancel``: a
    caller that gives up (``fetch_before``) leaves dest as it was, or whole when the swap came first."""
    started = time.monotonic()
    cache = options.cache
    dest = real_dest(dest)
    recover_interrupted_swap(dest)  # first: even a fetch that fails next must not leave dest missing
    manifest = cached_manifest(cache, entry, fingerprint)
    if manifest is None:
        store = store or Store.from_url(url)
        manifest, _ = resolve_manifest(store, entry, fingerprint)
    elif store is None and not cache.holds_all(manifest):  # type: ignore[union-attr]
        store = Store.from_url(url)
    # else: a fully warm node needs no store at all (nor gcsfs' import, seconds on a busy node)
    dest = prepare_dest(dest, manifest)
    meter = Meter(options.progress, manifest.total_size)
    keep = frozenset(f.sha256 for f in manifest.files)
    cache = make_room(cache, manifest, keep)
    download, placed = None, False
    try:
        with Staging(dest) as staging:
            download = new_download(store or LazyStore(url), manifest, staging.path, meter, options, cache, cancel)
            download.run()
            write_new(os.path.join(staging.path, MANIFEST_NAME), manifest.to_json().encode())
            (cancel or Cancel()).swap(staging)
            placed = True
    finally:
        meter.close()
        if cache is not None:
            still_usable = isinstance(download, ThroughNodeCache) and download.cache is not None
            settle(cache, manifest if placed and still_usable else None, keep)
    return FetchResult(store=store.url if store else url, entry=manifest.entry, fingerprint=manifest.fingerprint, dest=dest,
                       files=len(manifest.files), size=manifest.total_size,
                       objects=len({f.sha256 for f in manifest.files}), retried_objects=download.retried_objects,
                       seconds=time.monotonic() - started, downloaded_size=download.downloaded_size,
                       cached_objects=download.cached_objects, cache_dir=cache.root if cache else None)


def new_download(store: Store, manifest: Manifest, root: str, meter: Meter, options: FetchOptions,
                 cache: NodeCache | None, cancel: Cancel | None) -> Download:
    """Straight from the store, or through the node cache when there is one."""
    if cache is None:
        return Download(store, manifest, root, meter, options.workers, options.chunk_size)
    return ThroughNodeCache(store, manifest, root, meter, options.workers, options.chunk_size, cache, cancel,
                            lock_stall_for(options.deadline))


def fetch_before(url: str, dest: str, entry: Any = None, fingerprint: str | None = None,
                 options: FetchOptions = FetchOptions()) -> FetchResult:
    """``fetch_artifact`` that gives up after ``options.deadline`` seconds with DeadlineExceeded.

    The fetch runs on a daemon thread; one that is stalled in the store's retries (or interrupted by a
    signal) is abandoned: told not to swap, its staging dir removed, so dest stays as it was (or is the whole
    artifact, when its swap came first). The caller should exit the process soon after, without joining
    threads (the abandoned thread's pools would be joined at exit).
    """
    cancel, finished = Cancel(), threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fetch_artifact(url, dest, entry, fingerprint, options, cancel=cancel)
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc
        finally:
            finished.set()

    # waits on ``finished``, not on the thread: a join that a signal interrupts marks the thread as ended
    # (CPython 3.11), and the grace below would not wait at all
    try:
        threading.Thread(target=run, name="aotc-fetch", daemon=True).start()
        finished.wait(min(options.deadline, threading.TIMEOUT_MAX))  # a longer wait (1e308 s) is a wait without end
    except BaseException:  # SIGTERM or Ctrl-C while waiting: the abandoned fetch leaves nothing behind
        abandon(cancel, finished, dest)
        raise
    if not finished.is_set() and abandon(cancel, finished, dest):
        raise DeadlineExceeded(f"{url} did not deliver the artifact within the {options.deadline:g} s "
                               "deadline (fetch --deadline)")
    finished.wait()  # swapped in just before the deadline: what is left is local (the node cache's upkeep)
    if "error" in box:
        raise box["error"]
    return box["result"]


def abandon(cancel: Cancel, finished: threading.Event, dest: str) -> bool:
    """Tell the fetch thread not to swap (a swap under way finishes first), give it a moment to clean up
    after itself, then remove its staging dir here (a thread stalled in the store's retries never gets to).
    True when dest stayed as it was."""
    kept = cancel.give_up()
    finished.wait(ABANDON_GRACE)
    remove_staging(dest)
    return kept
