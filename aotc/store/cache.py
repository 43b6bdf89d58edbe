"""A node-local object cache for fetch (``fetch --cache-dir DIR``, ``$AOTC_CACHE_DIR``).

Objects are content-addressed, so one copy per node serves every pod and every entry that shares it::

    <dir>/objects/<2 hex>/<sha256>   read-only, verified before it got its name
    <dir>/locks/<sha256>             flock: one fetcher per node downloads an object, others wait for it
    <dir>/tmp/                       downloads in progress (a killed fetcher leaves junk here, removed later)
    <dir>/manifests/<entry>/<fp>.json  manifests fetched here: a store writes each path once, so a fully
                                     warm node fetches without contacting the store

Insert: a download lands in ``tmp/``, its sha256 is checked while it streams, and only then is it linked
to its name. Serve: the size must match and the mtime must still be the sentinel set at insert (a write
through any hard link, e.g. into a pod's dest, changes it); anything else is evicted and fetched again,
so a corrupted object is never served. Use stamps the atime explicitly (LRU order even on noatime
mounts). Eviction removes least-recently-used objects until the cache fits its size bound, skipping
objects another fetcher holds a lock on.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass

from aotc.errors import BadInput, IntegrityError
from aotc.files import parse_time, remove_quietly
from aotc.manifest import Manifest
from aotc.store.layout import check_name

ENV_CACHE_DIR = "AOTC_CACHE_DIR"
ENV_CACHE_MAX_SIZE = "AOTC_CACHE_MAX_SIZE"
DEFAULT_MAX_SIZE = 50 << 30
SENTINEL_MTIME_NS = 1_000_000_000 * 10**9  # 2001-09-09: "unchanged since insert"
TMP_MAX_AGE = 3600.0  # a download in tmp/ older than this belongs to a dead fetcher
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'50G', '512M', '1073741824' → bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    if not match:
        raise BadInput(f"not a size: {text!r} (use e.g. 50G, 512M or a byte count)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


@dataclass(frozen=True)
class EvictionReport:
    removed_objects: int
    removed_size: int
    size_after: int


class NodeCache:
    def __init__(self, root: str, max_size: int = DEFAULT_MAX_SIZE):
        self.root = os.path.abspath(root)
        self.max_size = max_size
        for sub in ("objects", "locks", "tmp"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)

    def path(self, sha256: str) -> str:
        return os.path.join(self.root, "objects", sha256[:2], sha256)

    def lookup(self, sha256: str, size: int) -> str | None:
        """The cached file for this object if it is intact, else None (and a damaged one is gone)."""
        path = self.path(sha256)
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if st.st_size == size and st.st_mtime_ns == SENTINEL_MTIME_NS and os.path.isfile(path) \
                and not os.path.islink(path):
            os.utime(path, ns=(time.time_ns(), SENTINEL_MTIME_NS), follow_symlinks=False)  # LRU stamp
            return path
        remove_quietly(path)  # changed since insert: never serve it
        return None

    def holds_all(self, manifest: Manifest) -> bool:
        """Every object of ``manifest`` is here with its size (a cheap pre-check; lookup decides)."""
        for f in manifest.files:
            try:
                if f.size and os.stat(self.path(f.sha256), follow_symlinks=False).st_size != f.size:
                    return False
            except FileNotFoundError:
                return False
        return True

    def manifest(self, entry: str, fingerprint: str) -> Manifest | None:
        path = self._manifest_path(entry, fingerprint)
        try:
            with open(path, "rb") as f:
                manifest = Manifest.from_json(f.read(64 << 20))
        except FileNotFoundError:
            return None
        except (OSError, IntegrityError):
            remove_quietly(path)  # damaged: the store has the real one
            return None
        return manifest if (manifest.entry, manifest.fingerprint) == (entry, fingerprint) else None

    def manifest_by_fingerprint(self, fingerprint: str) -> Manifest | None:
        try:
            check_name(fingerprint, "fingerprint")
        except IntegrityError:
            return None
        found = [m for entry in _listdir(os.path.join(self.root, "manifests"))
                 if (m := self.manifest(entry, fingerprint)) is not None]
        return max(found, key=lambda m: parse_time(m.created)) if found else None

    def save_manifest(self, manifest: Manifest) -> None:
        path = self._manifest_path(manifest.entry, manifest.fingerprint)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temp = self.new_temp()
        with open(temp, "w") as f:
            f.write(manifest.to_json())
        os.replace(temp, path)

    def _manifest_path(self, entry: str, fingerprint: str) -> str:
        return os.path.join(self.root, "manifests", check_name(entry, "entry name"),
                            f"{check_name(fingerprint, 'fingerprint')}.json")

    def new_temp(self) -> str:
        return os.path.join(self.root, "tmp", f"{uuid.uuid4().hex}.part")

    def insert(self, temp: str, sha256: str) -> str:
        """Give a verified download in tmp/ its name; another fetcher's identical copy may win."""
        path = self.path(sha256)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.chmod(temp, 0o444)
        os.utime(temp, ns=(time.time_ns(), SENTINEL_MTIME_NS))
        os.replace(temp, path)  # same bytes either way: the last rename is as good as the first
        return path

    def lock(self, sha256: str, wait: bool = True) -> int | None:
        """Hold this object's lock until the returned descriptor is closed: one download per node;
        eviction skips the object meanwhile. None when ``wait`` is False and someone holds it."""
        fd = os.open(self._lock_path(sha256), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def _lock_path(self, sha256: str) -> str:
        return os.path.join(self.root, "locks", sha256)

    def evict(self, keep: frozenset[str] = frozenset()) -> EvictionReport:
        """Remove least-recently-used objects until the cache fits ``max_size``; ``keep`` stays."""
        self._clean_tmp()
        entries = []
        for sub in _listdir(os.path.join(self.root, "objects")):
            for name in _listdir(os.path.join(self.root, "objects", sub)):
                try:
                    st = os.stat(os.path.join(self.root, "objects", sub, name), follow_symlinks=False)
                except FileNotFoundError:
                    continue
                entries.append((st.st_atime_ns, name, st.st_size))
        total = sum(size for _, _, size in entries)
        removed = removed_size = 0
        for _, sha, size in sorted(entries):
            if total <= self.max_size:
                break
            if sha in keep or not self._evict_one(sha):
                continue
            total -= size
            removed, removed_size = removed + 1, removed_size + size
        return EvictionReport(removed, removed_size, total)

    def _evict_one(self, sha: str) -> bool:
        fd = os.open(self._lock_path(sha), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a fetcher is inserting or about to serve it
            remove_quietly(self.path(sha))
            return True
        finally:
            os.close(fd)

    def _clean_tmp(self) -> None:
        now = time.time()
        for name in _listdir(os.path.join(self.root, "tmp")):
            path = os.path.join(self.root, "tmp", name)
            try:
                if now - os.stat(path).st_mtime > TMP_MAX_AGE:
                    remove_quietly(path)
            except FileNotFoundError:
                continue


def place(source: str, target: str) -> None:
    """Hard-link a cached object into a dest (same filesystem), else copy it (kernel-side)."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
        os.chmod(target, 0o644)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []

