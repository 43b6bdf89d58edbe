"""What publish and fetch share to move many files: a thread-safe byte meter and a fail-fast map."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, TypeVar

_T = TypeVar("_T")
_R = TypeVar("_R")


def run_parallel(fn: Callable[[_T], _R], items: Iterable[_T], workers: int) -> list[_R]:
    """``map`` on a thread pool that stops at the first error and raises it (not a wrapped one)."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(fn, item) for item in items]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        for future in futures:
            if future.done() and not future.cancelled() and future.exception():
                raise future.exception()  # type: ignore[misc]
        return [f.result() for f in futures]


class Meter:
    """A byte counter that many worker threads feed into one fsspec Callback (the CLI's bar, or none)."""

    def __init__(self, callback: Any = None, total: int = 0):
        from fsspec.callbacks import NoOpCallback

        self._callback = callback or NoOpCallback()
        self._lock = threading.Lock()
        self._callback.set_size(total)

    def add(self, n: int) -> None:
        with self._lock:
            self._callback.relative_update(n)

    def close(self) -> None:
        close = getattr(self._callback, "close", None)
        if close:
            close()
