"""Evidence per window from JAX's own compile path: which cache keys each call looked up, found, wrote.

Two sources that cross-check each other: JAX's monitoring events (compile requests that use the
persistent cache, hits, entries written, backend compiles) and the keys the persistent cache was asked
for (wrapping `compilation_cache.get_executable_and_time` / `put_executable_and_time`, which the
compiler looks up on that module at call time). In jax 0.11 a "cache miss" event is only recorded
when an entry is written, so misses are counted as requests minus hits.

A window is (phase, kind, family, shape); windows nest and evidence goes to the innermost one. A ``Window``
accumulates while it is open; ``snapshot`` gives each as the runners' shared ``Record`` (aotc/runners/records.py),
which build and verify read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any

from aotc.runners.protocol import FamilyRow
from aotc.runners.records import Record

CACHE_SUFFIX = "-cache"  # jax._src.lru_cache: <key>-cache
EVENTS = {
    "/jax/compilation_cache/compile_requests_use_cache": "requests",
    "/jax/compilation_cache/cache_hits": "hits",
    "/jax/compilation_cache/cache_misses": "writes",
}
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # hits included


@dataclasses.dataclass
class Window:
    phase: str
    kind: str  # phase | call | step
    family: str
    shape: dict[str, Any]
    requests: int = 0
    hits: int = 0
    writes: int = 0
    backend_compiles: int = 0
    deserialize_failures: int = 0
    compile_seconds: float = 0.0
    found: list[str] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)
    written: list[str] = dataclasses.field(default_factory=list)
    unloadable: list[str] = dataclasses.field(default_factory=list)
    """Entries found that this process cannot deserialize (a compile-only client loads nothing)."""
    compiled: list[dict[str, int]] = dataclasses.field(default_factory=list)
    """The compiler's figures of each executable compiled for a TPU target (compile_only.memory_figures)."""
    seconds: float = 0.0

    def record(self) -> Record:
        return Record(self.phase, self.kind, self.family, dict(self.shape), self.seconds, found=tuple(self.found),
                      missing=tuple(self.missing), written=tuple(self.written), unloadable=tuple(self.unloadable),
                      compile_seconds=self.compile_seconds, counts=self.counts(),
                      compiled=tuple(dict(figures) for figures in self.compiled))

    def counts(self) -> FamilyRow:
        """An entry found is loaded (a hit: JAX deserializes every entry it loads) or not loadable here (JAX then
        compiles and writes the same key again); JAX's backend-compile event counts hits too."""
        found = self.hits + len(self.unloadable)
        return FamilyRow(requests=self.requests, found=found, loads=self.hits, misses=self.requests - found,
                         writes=self.writes, compiles=self.backend_compiles - self.hits,
                         uncached_compiles=self.backend_compiles - self.requests,
                         deserialize_failures=self.deserialize_failures)

    @property
    def empty(self) -> bool:
        return not (self.requests or self.backend_compiles or self.found or self.missing or self.written)


class Probe:
    def __init__(self) -> None:
        self.phase = "startup"
        self.records: list[Window] = []
        self._stack: list[Window] = [Window("startup", "phase", "startup", {})]
        self._lock = threading.RLock()
        self._thread = threading.local()  # .window: where a precompile worker thread's evidence goes

    # -- windows ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def window(self, kind: str, family: str, shape: dict[str, Any] | None = None):
        win = Window(self.phase, kind, family, dict(shape or {}))
        started = time.perf_counter()
        with self._lock:
            self._stack.append(win)
        try:
            yield win
        finally:
            win.seconds = round(time.perf_counter() - started, 4)
            with self._lock:
                self._stack.remove(win)
                self.records.append(win)

    def enter_phase(self, phase: str) -> None:
        """Close the open phase window (evidence outside any call) and open the next one."""
        with self._lock:
            outside = self._stack[0]
            if not outside.empty:
                self.records.append(outside)
            self.phase = phase
            self._stack[0] = Window(phase, "phase", phase, {})

    def snapshot(self) -> list[Record]:
        with self._lock:
            pending = [self._stack[0]] if not self._stack[0].empty else []
            return [w.record() for w in [*self.records, *pending]]

    def current(self) -> Window:
        with self._lock:
            return self._current()

    def _current(self) -> Window:
        return getattr(self._thread, "window", None) or self._stack[-1]

    def pinned(self, window: Window, fn):
        """``fn`` that records into ``window`` from whichever thread runs it (NUM_PRECOMPILE_WORKERS > 1
        compiles on a pool after the call's window has closed)."""
        def run(*args, **kwargs):
            previous = getattr(self._thread, "window", None)
            self._thread.window = window
            try:
                return fn(*args, **kwargs)
            finally:
                self._thread.window = previous

        return run

    # -- JAX hooks --------------------------------------------------------------------------------

    def install(self) -> None:
        from jax import monitoring
        from jax._src import compilation_cache

        monitoring.register_event_listener(self._on_event)
        monitoring.register_event_duration_secs_listener(self._on_duration)
        get, put = compilation_cache.get_executable_and_time, compilation_cache.put_executable_and_time

        def get_executable_and_time(cache_key, *args, **kwargs):
            try:
                executable, compile_time = get(cache_key, *args, **kwargs)
            except Exception:
                with self._lock:
                    self._current().deserialize_failures += 1
                    self._current().unloadable.append(cache_key + CACHE_SUFFIX)
                raise
            with self._lock:
                (self._current().found if executable is not None else self._current().missing).append(
                    cache_key + CACHE_SUFFIX)
            return executable, compile_time

        def put_executable_and_time(cache_key, *args, **kwargs):
            with self._lock:
                self._current().written.append(cache_key + CACHE_SUFFIX)
            return put(cache_key, *args, **kwargs)

        compilation_cache.get_executable_and_time = get_executable_and_time
        compilation_cache.put_executable_and_time = put_executable_and_time

    def record_compile(self, figures: dict[str, int]) -> None:
        with self._lock:
            self._current().compiled.append(figures)

    def _on_event(self, event: str, **_kwargs) -> None:
        field = EVENTS.get(event)
        if field:
            with self._lock:
                win = self._current()
                setattr(win, field, getattr(win, field) + 1)

    def _on_duration(self, event: str, duration: float, **_kwargs) -> None:
        if event == BACKEND_COMPILE_EVENT:
            with self._lock:
                win = self._current()
                win.backend_compiles += 1
                win.compile_seconds = round(win.compile_seconds + duration, 4)
