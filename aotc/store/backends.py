"""Write (and local read) semantics per kind of backend.

Object stores (gs://, memory://, s3://) make an upload visible whole, and ``pipe_file(mode="create")``
is a native create-if-absent (``ifGenerationMatch=0`` on GCS). A POSIX folder has neither, so there
every write goes to a hidden sibling first and becomes visible by ``rename`` (objects, refs) or by a
hard ``link``, which fails when the target exists (manifests). A folder is also the one backend where
a stored "object" can be a link to ``/dev/zero`` or a FIFO: reads there accept regular files only.
"""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Callable
from typing import Any

from aotc.errors import IntegrityError
from aotc.files import remove_quietly


class ObjectStoreIO:
    """Uploads become visible whole; create-if-absent is native (GCS: ifGenerationMatch=0)."""

    def __init__(self, fs: Any):
        self.fs = fs

    def put(self, lpath: str, rpath: str) -> None:
        self.fs.put_file(lpath, rpath)

    def create(self, rpath: str, data: bytes) -> None:
        self.fs.pipe_file(rpath, data, mode="create")

    def replace(self, rpath: str, data: bytes) -> None:
        self.fs.pipe_file(rpath, data)

    def read(self, rpath: str, start: int | None = None, end: int | None = None) -> bytes:
        return self.fs.cat_file(rpath, start=start, end=end)


class FolderIO(ObjectStoreIO):
    """A POSIX folder: write a hidden sibling, then rename (replace) or hard-link (create-if-absent).

    A SIGKILL mid-copy then leaves only a ``.tmp-`` file that readers ignore and gc removes.
    """

    def _aside(self, rpath: str) -> str:
        parent, name = rpath.rsplit("/", 1)
        self.fs.makedirs(parent, exist_ok=True)
        return f"{parent}/.{name}.tmp-{uuid.uuid4().hex}"

    def _via_aside(self, rpath: str, write: Callable[[str], Any], publish: Callable[[str, str], Any]) -> None:
        tmp = self._aside(rpath)
        try:
            write(tmp)
            publish(tmp, rpath)
        finally:
            remove_quietly(tmp)

    def put(self, lpath: str, rpath: str) -> None:
        self._via_aside(rpath, lambda tmp: self.fs.put_file(lpath, tmp), self.fs.mv)

    def replace(self, rpath: str, data: bytes) -> None:
        self._via_aside(rpath, lambda tmp: self.fs.pipe_file(tmp, data), self.fs.mv)

    def create(self, rpath: str, data: bytes) -> None:
        # os.link is atomic and exclusive; no fsspec primitive has both
        self._via_aside(rpath, lambda tmp: self.fs.pipe_file(tmp, data), os.link)

    def read(self, rpath: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes [start, end) of a regular file; never follows a link, never blocks on a FIFO."""
        try:
            fd = os.open(rpath, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise IntegrityError(f"{rpath}: not a regular file in the store ({exc.strerror})") from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise IntegrityError(f"{rpath}: not a regular file in the store")
            start = start or 0
            size = os.fstat(fd).st_size
            end = size if end is None else min(end, size)
            return os.pread(fd, max(0, end - start), start)
        finally:
            os.close(fd)

