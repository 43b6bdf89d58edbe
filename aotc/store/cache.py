"""A node-local object cache for fetch (``fetch --cache-dir DIR``, ``$AOTC_CACHE_DIR``).

Objects are content-addressed, so one copy per node serves every pod and every entry that shares it::

    <dir>/objects/<2 hex>/<sha256>   read-only, verified before it got its name
    <dir>/locks/<sha256>             flock: one fetcher per node downloads an object, others wait for it;
                                     it records the object's seal and its holder's pid and download path
    <dir>/tmp/<pid>-<random>/        one fetcher's downloads in progress; it holds an flock on the dir
    <dir>/manifests/<entry>/<fp>.json  manifests fetched here: a store writes each path once, so a fully
                                     warm node fetches without contacting the store

Insert: a download lands in the fetcher's own tmp dir, its sha256 is checked while it streams, then it is
renamed to its name and sealed (``Seal``: inode, size, mtime, ctime and link count, as when hashed, with its
HMAC under a key kept outside the cache: whoever can write the cache can write a seal, not sign one). Serve:
dests get hard links (a copy across filesystems). A dest shares the cache's inode, so a pod writing its dest,
or anyone writing the object whatever mtime they restore, changes the cached bytes; no size or mtime check
can tell, but the kernel's ctime moves. A sealed object is linked and sealed anew when that link is all that
changed it; anything else (a write, a chmod, another dest unlinked) means the linked bytes are hashed: the
same bytes are sealed again, others are removed and downloaded. A changed object is never served.

Clean-up never touches a live fetcher's download: a tmp dir is removed only when its flock is free (its
fetcher is gone). Damage heals: whatever stands where one of the cache's dirs or files belongs (a file for a
dir, a dir for a file, a link) is removed and the object fetched again. Eviction removes least-recently-used
objects (the lock file's mtime, stamped on every use) until the cache fits its size bound, before a fetch
inserts and after it, skipping objects another fetcher holds a lock on.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
import uuid
from dataclasses import astuple, dataclass
from typing import Any

from aotc.errors import BadInput, IntegrityError
from aotc.files import aotc_home, parse_time, pid_namespace, process_state, remove_quietly, sha256_file
from aotc.manifest import Manifest
from aotc.store.layout import SHA256_HEX, check_name

ENV_CACHE_DIR = "AOTC_CACHE_DIR"
ENV_CACHE_MAX_SIZE = "AOTC_CACHE_MAX_SIZE"
ENV_CACHE_KEY_FILE = "AOTC_CACHE_KEY_FILE"
KEY_NAME = "node-cache.key"
DEFAULT_MAX_SIZE = 50 << 30
SUBDIRS = ("objects", "locks", "tmp", "manifests")
TMP_GRACE = 60.0  # an unlocked tmp dir younger than this may belong to a fetcher about to lock it
TMP_MAX_AGE = 3600.0  # a loose file in tmp/ whose ctime is older than this is junk (ctime: no utime fakes it)
# a cache that fails with one of these is skipped (the store serves), never the reason a fetch fails
UNUSABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
logger = logging.getLogger(__name__)


def parse_size(text: str) -> int:
    """'50G', '512M', '1073741824' → bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    if not match:
        raise BadInput(f"not a size: {text!r} (use e.g. 50G, 512M or a byte count)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def unusable(exc: BaseException) -> bool:
    """The cache's filesystem refuses (read-only, full, not ours): fetch goes around the cache."""
    return isinstance(exc, OSError) and exc.errno in UNUSABLE


@dataclass(frozen=True)
class EvictionReport:
    removed_objects: int
    removed_size: int
    size_after: int


@dataclass(frozen=True)
class Seal:
    """An object's inode as it was when its bytes were hashed. The kernel sets ctime to now on every
    write, chmod, utime, link or unlink, and no user can set it back: a seal that still matches means
    the bytes hashed are the bytes there, without reading them."""

    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int
    nlink: int

    @classmethod
    def of(cls, st: os.stat_result) -> Seal:
        return cls(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink)

    def linked_once_more(self, st: os.stat_result) -> bool:
        """``st`` is this inode with one more hard link and no other change but the ctime that link set
        (a write moves mtime; one that put mtime back within that instant is the one change not seen)."""
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_nlink) == \
            (self.ino, self.size, self.mtime_ns, self.nlink + 1)


class NodeCache:
    def __init__(self, root: str, max_size: int = DEFAULT_MAX_SIZE, key_file: str | None = None):
        """``key_file``: the key that signs seals (default ``$AOTC_CACHE_KEY_FILE``, else
        ``$AOTC_HOME/node-cache.key``, created on first use); never inside the cache."""
        self.root = os.path.abspath(root)
        self.max_size = max_size
        self._tmp: tuple[str, int] | None = None  # this fetcher's tmp dir and the fd holding its flock
        os.makedirs(self.root, exist_ok=True)  # a root that is a file is the caller's mistake (exit 2)
        self._key = seal_key(self.root, key_file)
        for sub in SUBDIRS:
            self._make_dir(os.path.join(self.root, sub))

    def path(self, sha256: str) -> str:
        return os.path.join(self.root, "objects", sha256[:2], sha256)

    # --- serving ---------------------------------------------------------------------------------

    def lookup(self, sha256: str, size: int, lock: int) -> os.stat_result | None:
        """The cached object's stat if a regular file of the right size is there (its bytes are checked
        where it is placed: ``sealed``, ``reseal_after_link``, ``verify_linked``); anything else at its
        path is removed."""
        path = self.path(sha256)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            self._clear(path, "not the object it is named for")
            return None
        os.utime(lock)  # LRU stamp on the lock file: touching the object would move its ctime
        return st

    def sealed(self, sha256: str, st: os.stat_result, lock: int) -> bool:
        """The object is as it was when its bytes were last hashed (see ``Seal``), by a seal this node's key
        signed (whoever can write the cache can write a lock file too, but cannot sign)."""
        return Seal.of(st) == self._seal(sha256, lock)

    def reseal_after_link(self, sha256: str, before: os.stat_result, lock: int) -> bool:
        """After linking a sealed object into a dest: True, and sealed anew, when that link is all that
        changed its inode; else False (hash what was linked: ``verify_linked``)."""
        try:
            after = os.lstat(self.path(sha256))
        except OSError:
            return False
        if not Seal.of(before).linked_once_more(after):
            return False
        self._write_seal(lock, sha256, after)
        return True

    def verify_linked(self, sha256: str, size: int, target: str, lock: int) -> bool:
        """Hash what was placed at ``target``; when it is the cached inode itself and nothing changed it
        while it was read, seal it (the next fetch skips the hash)."""
        before = os.lstat(target)
        if sha256_file(target) != (sha256, size):
            return False
        after = os.lstat(target)
        try:
            same_inode = os.lstat(self.path(sha256)).st_ino == after.st_ino
        except OSError:
            same_inode = False
        if same_inode and Seal.of(after) == Seal.of(before):
            self._write_seal(lock, sha256, after)
        return True

    def discard(self, sha256: str) -> None:
        """A cached object whose bytes are not its name's: remove it (under its lock)."""
        self._clear(self.path(sha256), "its bytes changed since it was cached")

    def holds_all(self, manifest: Manifest) -> bool:
        """Every object of ``manifest`` is here with its size (a cheap pre-check; lookup decides)."""
        return self.missing_size(manifest) == 0

    def missing_size(self, manifest: Manifest) -> int:
        """Bytes of ``manifest``'s objects this cache does not hold (what a fetch will insert)."""
        sizes = {f.sha256: f.size for f in manifest.files if f.size}
        missing = 0
        for sha, size in sizes.items():
            try:
                st = os.lstat(self.path(sha))
            except OSError:
                st = None
            if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != size:
                missing += size
        return missing

    # --- inserting -------------------------------------------------------------------------------

    def new_temp(self) -> str:
        return os.path.join(self._owned_tmp(), f"{uuid.uuid4().hex}.part")

    def insert(self, temp: str, sha256: str, lock: int) -> str:
        """Give a verified download its name and seal it (under the object's lock)."""
        path = self.path(sha256)
        self._make_dir(os.path.dirname(path))
        if os.path.isdir(path) and not os.path.islink(path):
            self._clear(path, "a directory where an object belongs")
        os.chmod(temp, 0o444)
        os.replace(temp, path)
        self._write_seal(lock, sha256, os.lstat(path))
        os.utime(lock)
        return path

    def close(self) -> None:
        """Remove this fetcher's tmp dir (a killed fetcher's is removed by the next clean-up)."""
        if self._tmp is not None:
            path, fd = self._tmp
            self._tmp = None
            shutil.rmtree(path, ignore_errors=True)
            os.close(fd)

    def _owned_tmp(self) -> str:
        if self._tmp is None:
            parent = self._make_dir(os.path.join(self.root, "tmp"))
            path = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=parent)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._tmp = (path, fd)
        return self._tmp[0]

    # --- locks -----------------------------------------------------------------------------------

    def try_lock(self, sha256: str) -> int | None:
        """This object's lock (an fd: close it to release), or None while another fetcher holds it.
        The holder writes its pid into the lock file at once, so a waiter can tell if it was stopped."""
        fd = self._open_lock(sha256)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            self.mark_holder(fd)
        except OSError:
            os.close(fd)
            raise
        return fd

    def mark_holder(self, lock: int, temp: str | None = None) -> None:
        """Tell waiters who holds this lock and where its download lands (see ``holder_progress``)."""
        self._write_record(lock, holder={"pid": os.getpid(), "pidns": pid_namespace(), "temp": temp})

    def holder_progress(self, sha256: str) -> tuple[Any, ...]:
        """What a waiter watches: who holds the lock, how far its download got, when the lock was used."""
        path = self._lock_path(sha256)
        try:
            with open(path, "rb") as f:
                record, mtime = _parse_record(f.read(4096)), os.fstat(f.fileno()).st_mtime_ns
        except OSError:
            return ()
        holder = record.get("holder") if isinstance(record.get("holder"), dict) else {}
        temp = holder.get("temp")
        try:
            grown = os.stat(temp).st_size if isinstance(temp, str) else -1
        except OSError:
            grown = -1
        return holder.get("pid"), holder.get("pidns"), temp, grown, mtime

    @staticmethod
    def stuck(progress: tuple[Any, ...]) -> str | None:
        """Why a lock's holder will never finish, when this process can see it (same pid namespace)."""
        if not progress or progress[1] is None or progress[1] != pid_namespace():
            return None
        pid = progress[0]
        if not isinstance(pid, int) or pid <= 0:
            return None
        state = process_state(pid)
        if state is None:
            return f"its holder, pid {pid}, is gone"
        if state in "TtZX":
            return f"its holder, pid {pid}, is stopped"
        return None

    def _open_lock(self, sha256: str) -> int:
        path = self._lock_path(sha256)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno not in (errno.EISDIR, errno.ENOTDIR, errno.ENOENT, errno.ELOOP):
                raise
        self._make_dir(os.path.dirname(path))
        if os.path.lexists(path):
            self._clear(path, "not a lock file")
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)

    def _lock_path(self, sha256: str) -> str:
        return os.path.join(self.root, "locks", sha256)

    def _seal(self, sha256: str, lock: int) -> Seal | None:
        """The lock file's seal, if this node's key signed it for this object; else None (hash it)."""
        record = self._record(lock)
        value, mac = record.get("seal"), record.get("mac")
        try:
            seal = Seal(*value) if isinstance(value, list) else None
        except TypeError:
            return None
        if seal is None or self._key is None or not isinstance(mac, str):
            return None
        return seal if hmac.compare_digest(mac, _sign(self._key, sha256, seal)) else None

    def _write_seal(self, lock: int, sha256: str, st: os.stat_result) -> None:
        seal = Seal.of(st)
        self._write_record(lock, seal=astuple(seal), mac=_sign(self._key, sha256, seal) if self._key else None)

    @staticmethod
    def _record(lock: int) -> dict[str, Any]:
        return _parse_record(os.pread(lock, 4096, 0))

    def _write_record(self, lock: int, **changes: Any) -> None:
        record = {k: v for k, v in (self._record(lock) | changes).items() if v is not None}
        body = json.dumps(record).encode()
        os.pwrite(lock, body, 0)
        os.ftruncate(lock, len(body))

    # --- manifests -------------------------------------------------------------------------------

    def manifest(self, entry: str, fingerprint: str) -> Manifest | None:
        path = self._manifest_path(entry, fingerprint)
        try:
            with open(path, "rb") as f:
                manifest = Manifest.from_json(f.read(64 << 20))
        except FileNotFoundError:
            return None
        except (OSError, IntegrityError):
            self._clear_way(path)  # damaged: the store has the real one
            return None
        return manifest if (manifest.entry, manifest.fingerprint) == (entry, fingerprint) else None

    def manifest_by_fingerprint(self, fingerprint: str) -> Manifest | None:
        try:
            check_name(fingerprint, "fingerprint")
        except IntegrityError:
            return None
        found = []
        for entry in _listdir(os.path.join(self.root, "manifests")):
            try:
                manifest = self.manifest(entry, fingerprint)
            except IntegrityError:  # not a name a store path can have: junk
                continue
            if manifest is not None:
                found.append(manifest)
        return max(found, key=lambda m: parse_time(m.created)) if found else None

    def save_manifest(self, manifest: Manifest) -> None:
        path = self._manifest_path(manifest.entry, manifest.fingerprint)
        self._make_dir(os.path.dirname(path))
        if os.path.isdir(path) and not os.path.islink(path):
            self._clear(path, "a directory where a manifest belongs")
        temp = self.new_temp()
        with open(temp, "w") as f:
            f.write(manifest.to_json())
        os.replace(temp, path)

    def _manifest_path(self, entry: str, fingerprint: str) -> str:
        return os.path.join(self.root, "manifests", check_name(entry, "entry name"),
                            f"{check_name(fingerprint, 'fingerprint')}.json")

    # --- eviction and clean-up -------------------------------------------------------------------

    def evict(self, keep: frozenset[str] = frozenset(), incoming: int = 0) -> EvictionReport:
        """Remove least-recently-used objects until the cache and ``incoming`` bytes fit ``max_size``;
        ``keep`` stays, and so does an object another fetcher holds the lock of."""
        self._clean_tmp()
        entries = self._objects()
        total = sum(size for _, _, size in entries)
        removed = removed_size = 0
        for _, sha, size in sorted(entries):
            if total + incoming <= self.max_size:
                break
            if sha in keep or not self._evict_one(sha):
                continue
            total -= size
            removed, removed_size = removed + 1, removed_size + size
        return EvictionReport(removed, removed_size, total)

    def _objects(self) -> list[tuple[int, str, int]]:
        """(last use, sha256, size) of every object; anything else under objects/ is removed."""
        entries = []
        objects = os.path.join(self.root, "objects")
        for shard in _listdir(objects):
            here = os.path.join(objects, shard)
            if not os.path.isdir(here) or os.path.islink(here):
                self._clear(here, "not a shard directory")
                continue
            for name in _listdir(here):
                try:
                    st = os.lstat(os.path.join(here, name))
                except FileNotFoundError:
                    continue
                if not (stat.S_ISREG(st.st_mode) and SHA256_HEX.fullmatch(name) and name[:2] == shard):
                    self._clear(os.path.join(here, name), "not a cached object")
                    continue
                entries.append((_mtime_ns(self._lock_path(name)), name, st.st_size))
        return entries

    def _evict_one(self, sha: str) -> bool:
        lock = self.try_lock(sha)
        if lock is None:
            return False  # a fetcher is inserting or about to serve it
        try:
            remove_quietly(self.path(sha))
            return True
        finally:
            os.close(lock)

    def _clean_tmp(self) -> None:
        """Remove what dead fetchers left in tmp/: a dir whose flock is free, a loose file long unchanged."""
        parent = os.path.join(self.root, "tmp")
        now = time.time()
        for name in _listdir(parent):
            path = os.path.join(parent, name)
            if self._tmp is not None and path == self._tmp[0]:
                continue
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if now - st.st_mtime > TMP_GRACE:
                    _remove_if_unlocked(path)
            elif now - st.st_ctime > TMP_MAX_AGE:
                remove_quietly(path)

    # --- healing ---------------------------------------------------------------------------------

    def _make_dir(self, path: str) -> str:
        """``path`` as a real dir: a file, link or anything else where one of its dirs belongs is removed."""
        here = self.root
        for part in os.path.relpath(path, self.root).split(os.sep):
            here = os.path.join(here, part)
            if os.path.islink(here) or (os.path.lexists(here) and not os.path.isdir(here)):
                self._clear(here, "not a directory")
            try:
                os.mkdir(here)
            except FileExistsError:
                pass
        return path

    def _clear_way(self, path: str) -> None:
        """Whatever is at ``path`` or stands in for one of its dirs goes (the next fetch writes it anew)."""
        here = self.root
        for part in os.path.relpath(path, self.root).split(os.sep):
            here = os.path.join(here, part)
            if here == path or os.path.islink(here) or (os.path.lexists(here) and not os.path.isdir(here)):
                if os.path.lexists(here):
                    self._clear(here, "damaged")
                return

    def _clear(self, path: str, why: str) -> None:
        logger.warning("node cache: removed %s (%s)", path, why)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            remove_quietly(path)


def seal_key(root: str, key_file: str | None = None, environ: Any = os.environ) -> bytes | None:
    """The key that signs this node's seals, kept out of the shared cache dir: a seal is what lets a fetch
    serve an object without reading it, so it is trusted only when signed by it. None (a key that cannot be
    read or made): no seal is trusted, every object served is hashed."""
    path = key_file or environ.get(ENV_CACHE_KEY_FILE) or str(aotc_home(environ) / KEY_NAME)
    real = os.path.realpath(path)
    if os.path.commonpath([real, os.path.realpath(root)]) == os.path.realpath(root):
        raise BadInput(f"seal key {path} ({ENV_CACHE_KEY_FILE}): inside the node cache {root}, where whoever writes "
                       "the cache could read it and sign what they wrote: keep it elsewhere")
    try:
        return _read_or_make_key(path)
    except OSError as exc:
        logger.warning("node cache: no seal key at %s (%s): every object served is hashed", path,
                       exc.strerror or exc)
        return None


def _read_or_make_key(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            key = f.read(4096)
    except FileNotFoundError:
        _make_key(path)
        return _read_or_make_key(path)
    if len(key) < 16:
        raise BadInput(f"seal key {path}: {len(key)} bytes; a node cache's seal key needs at least 16 (random)")
    return key


def _make_key(path: str) -> None:
    """Written whole, then linked to its name: a fetcher racing this one reads a whole key, its own or ours."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temp = f"{path}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        os.link(temp, path)
    except FileExistsError:
        pass  # another fetcher's key won: use that one
    finally:
        remove_quietly(temp)


def _sign(key: bytes, sha256: str, seal: Seal) -> str:
    return hmac.new(key, json.dumps([sha256, astuple(seal)]).encode(), hashlib.sha256).hexdigest()


def place(source: str, target: str) -> None:
    """Hard-link a cached object into a dest (same filesystem), else copy it (kernel-side)."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
        os.chmod(target, 0o644)


def _parse_record(data: bytes) -> dict[str, Any]:
    try:
        record = json.loads(data or b"{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _remove_if_unlocked(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return  # its fetcher is alive
    try:
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)


def _mtime_ns(path: str) -> int:
    try:
        return os.lstat(path).st_mtime_ns
    except OSError:
        return 0


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
