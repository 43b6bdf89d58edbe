"""Small file helpers the whole core shares: hashing, sizes, times, exclusive creates, the atomic dir swap.

The swap (``replace_dir``) is how build places an artifact dir and fetch places a dest: the new tree is
complete beside the target, then one rename makes it visible. ``renameat2(RENAME_EXCHANGE)`` swaps both
in one step; where it is unavailable the target is first renamed to ``<new>.old`` and
``recover_swap`` puts it back if a kill struck between the two renames.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aotc.errors import BadInput

OLD_SUFFIX = ".old"
# One plain path segment: a store's entry names and fingerprints (aotc/store/layout.py), hence a matrix's entries
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,199}")


def aotc_home(environ: Mapping[str, str] = os.environ) -> Path:
    """Where aotc keeps what outlives a run (venvs, the engine-argument and KV-sizing answers): $AOTC_HOME, else
    ~/.cache/aotc."""
    return Path(environ.get("AOTC_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "aotc"))


def sha256_file(path: str, block: int = 4 << 20) -> tuple[str, int]:
    """(hex sha256, size) of a file, read in blocks."""
    digest = hashlib.sha256()
    size = hash_file(path, digest, block=block)
    return digest.hexdigest(), size


def sha256_crc32c_file(path: str) -> tuple[str, int, str]:
    """(hex sha256, size, crc32c) in one read; crc32c spelled as GCS reports it (base64 of 4 big-endian
    bytes), so a store's report can be compared with the very bytes whose sha256 was checked."""
    import base64

    import google_crc32c  # gcsfs' own dependency (google-cloud-storage)

    digest, crc = hashlib.sha256(), google_crc32c.Checksum()
    size = hash_file(path, digest, crc)
    return digest.hexdigest(), size, base64.b64encode(crc.digest()).decode()


def hash_file(path: str, *hashers: object, block: int = 4 << 20) -> int:
    """Feed the file to every hasher (anything with ``update``) in one read; its size."""
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(block):
            for hasher in hashers:
                hasher.update(chunk)  # type: ignore[attr-defined]
            size += len(chunk)
    return size


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def parse_time(text: str) -> float:
    """ISO-8601 → epoch seconds; unparseable or out of range sorts oldest (0.0)."""
    stamp = checked_time(text)
    return 0.0 if stamp is None else stamp


def checked_time(text: Any) -> float | None:
    """ISO-8601 → epoch seconds, or None unless it is a time every reader can show: its UTC date within
    years 1-9999 (``0001-01-01T00:00+01:00`` parses, yet is year 0 in UTC)."""
    try:
        stamp = datetime.fromisoformat(text)
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=timezone.utc)
        seconds = stamp.timestamp()
        datetime.fromtimestamp(seconds, timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
    return seconds


def process_state(pid: int) -> str | None:
    """A local process's one-letter state from /proc/<pid>/stat (R, S, D, T, Z, ...); None: no such pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return text.rpartition(")")[2].split()[0] if ")" in text else None


@functools.lru_cache(maxsize=1)
def pid_namespace() -> str | None:
    """Pids mean something only within one pid namespace (pods on a node each have their own)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def remove_quietly(path: str) -> None:
    """Unlink a file that may already be gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def read_regular_file(path: str | Path, limit: int, follow_links: bool = True) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes. A user may name anything: /dev/zero is never
    read to exhaustion, a FIFO never waited on (O_NONBLOCK), a directory or device is refused by its kind;
    ``follow_links=False``: a link is refused too (ELOOP). Raises OSError as open does (FileNotFoundError,
    PermissionError) and ValueError for the rest."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW))
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind != "regular file":
            raise ValueError(f"is a {kind}, not a regular file")
        data = b""
        while len(data) <= limit and (chunk := os.read(fd, limit + 1 - len(data))):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"larger than {human_size(limit)}; not read")
    return data


def file_kind(mode: int) -> str:
    """What ``stat`` says a path is, in words for an error line."""
    for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def write_new(path: str, data: bytes, mode: int = 0o644) -> None:
    """Create a fresh regular file: never through a link, never over someone else's file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def replace_file(path: str | Path, data: bytes) -> Path:
    """Put ``data`` at a path a user named, atomically (a hidden sibling, then rename): no reader sees half of
    it. Only a regular file is replaced; a symlink to one is written through (the link stays), anything else
    there (a FIFO, a device, a directory, a link to nothing) is refused, since a rename would replace it
    whole. The sibling never outlives a failure."""
    target = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise BadInput(f"{path}: a symlink to {os.readlink(path)}, which does not exist; aotc does not "
                           "create a link's target") from None
    else:
        if not stat.S_ISREG(mode):
            raise BadInput(f"{path}: is a {file_kind(mode)}; aotc writes only a regular file there")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise BadInput(f"{target.parent}: cannot be made a directory: {exc.strerror}") from None
    temp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        write_new(str(temp), data)
        os.replace(temp, target)
    finally:
        remove_quietly(str(temp))
    return Path(path)


def check_replaceable_dir(path: str | Path) -> None:
    """``replace_dir`` renames a tree over ``path``: only a directory may be there, not a symlink (the rename
    would replace the link), a file or a device."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        raise BadInput(f"{path}: is a {file_kind(mode)}; aotc replaces only a directory there")


def replace_dir(new: str, target: str) -> None:
    """Make the complete dir ``new`` visible at ``target``; the previous ``target`` is removed after.

    Raises BadInput when ``target`` is not a directory, OSError (EBUSY, EXDEV) when it cannot be renamed over,
    e.g. a mount point.
    """
    check_replaceable_dir(target)
    if not os.path.lexists(target):
        os.rename(new, target)
        return
    if exchange(new, target):
        shutil.rmtree(new, ignore_errors=True)  # ``new`` now holds the previous target
        return
    aside = new + OLD_SUFFIX
    os.rename(target, aside)
    os.rename(new, target)  # a kill between the two renames: recover_swap(target, aside) restores it
    shutil.rmtree(aside, ignore_errors=True)


def recover_swap(target: str, aside: str) -> bool:
    """After a kill in the fallback swap: put ``aside`` back if ``target`` is gone, else drop it.

    True when it restored ``target``.
    """
    if not os.path.lexists(aside):
        return False
    if not os.path.lexists(target):
        os.rename(aside, target)
        return True
    shutil.rmtree(aside, ignore_errors=True)
    return False


def exchange(a: str, b: str) -> bool:
    """renameat2(RENAME_EXCHANGE): swap two dirs in one step, so ``b`` never disappears (Linux).

    False where the kernel or filesystem lacks it (or ``AOTC_NO_RENAME_EXCHANGE=1`` says so, which
    exercises the fallback on kernels that have it).
    """
    if os.environ.get("AOTC_NO_RENAME_EXCHANGE") == "1":
        return False
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


def canonical_json(data: Any) -> bytes:
    """The bytes a digest is taken over: sorted keys, no spaces, ASCII (a manifest's own digest, which
    stored manifests carry, keeps its non-ASCII form: aotc/store/core.py)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


# --- answers kept under $AOTC_HOME (engine-argument verdicts, KV sizings) ---------------------------


def answer_path(directory: Path, question: Any, *checkers: Path) -> Path:
    """Where the answer to ``question`` is kept: keyed by the question, aotc's own version and the source of
    the code that answers it, so a fixed checker never reads what its predecessor answered."""
    version = sys.modules[__package__].__version__  # the aotc package: loaded before any of its modules
    sources = [hashlib.sha256(path.read_bytes()).hexdigest() for path in checkers]
    return directory / f"{hashlib.sha256(canonical_json([question, version, sources])).hexdigest()}.json"


def kept_answer(path: Path, valid: Callable[[Any], bool]) -> Any:
    """The answer kept at ``path``, or None: absent, or not one ``valid`` accepts (it is removed, and the caller
    asks again: a file anyone could write under $AOTC_HOME is never trusted as found)."""
    try:
        answer = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError):
        answer = None
    if answer is not None and valid(answer):
        return answer
    try:
        os.unlink(path)
    except OSError:
        pass  # a read-only home: asked again, not kept
    return None


def keep_answer(path: Path, answer: Any) -> None:
    """Write atomically; a read-only home only costs the next run the question again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(answer))
        os.replace(tmp, path)
    except OSError:
        pass
