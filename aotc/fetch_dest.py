"""Where a fetch puts the artifact: ``dest`` checked before a byte moves (links, a manifest's paths, a dest
that holds anything but an earlier fetch is refused: fetch never deletes a user's files), a staging dir
beside it, and the one rename that swaps it in, so a previous ``dest`` survives any failure untouched; a
kill between the fallback swap's two renames is recovered on the next fetch."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
from typing import Any

from aotc.errors import BadInput, DeadlineExceeded, IntegrityError
from aotc.files import OLD_SUFFIX, recover_swap, remove_quietly, replace_dir
from aotc.manifest import MANIFEST_NAME, Manifest, check_relative_path
from aotc.store import SHA256_HEX

STAGING_MARK = ".aotc-staging-"


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


class Staging:
    """A fresh dir beside dest (same filesystem, so the final rename is atomic); removed on failure."""

    def __init__(self, dest: str):
        self.dest = dest
        self.parent = os.path.dirname(dest)
        self.path = ""

    def __enter__(self) -> Staging:
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


class Cancel:
    """A caller giving up on a fetch (``fetch_before``: a signal, the deadline), and the fetch's swap: each
    excludes the other. Once ``give_up`` returns, dest is either the whole new artifact or as it was and stays
    so; the caller may then remove the staging dir and exit at once, never in the middle of a swap (a staging
    dir removed while it is renamed into dest would leave dest partial)."""

    def __init__(self) -> None:
        self._given_up = threading.Event()
        self._swap = threading.Lock()
        self._swapped = False

    def is_set(self) -> bool:
        return self._given_up.is_set()

    def give_up(self) -> bool:
        """True when dest stays as it was; False when the artifact was swapped in before this call."""
        with self._swap:
            self._given_up.set()
            return not self._swapped

    def swap(self, staging: Staging) -> None:
        with self._swap:
            if self._given_up.is_set():
                raise DeadlineExceeded("fetch cancelled before placing the artifact")
            staging.swap_into_place()
            self._swapped = True
