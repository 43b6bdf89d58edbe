"""Evidence of what a call compiled, loaded or failed to load.

Three independent sources, cross-checked by the caller:

* the cache directory itself: a file that appears is a graph compiled and
  persisted; a file whose inode/mtime/size changed is a key that was found on
  disk, failed to deserialize, was erased and written again (torch_xla's
  PersistentCache does exactly that). Neither can miss a compile that reaches
  the persistent cache, whatever the counters say.
* torch_xla counters. torch_xla's dynamo bridge calls `metrics.clear_counters()`
  while extracting a graph, which is why raw PersistentCache* counters
  under-report; `Counters` accumulates across those resets.
* the process's stderr log (if the runner redirected it to a file): the
  "Failed to deserialize" warnings the PJRT client prints.

Windows nest: a key (or counter delta) is attributed to the innermost window
open when it appeared, so a family window only keeps what its calls did not.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aotc.runners.protocol import FamilyRow
from aotc.runners.records import OUTSIDE, UNATTRIBUTED, Record

DESERIALIZE_MARKER = b"Failed to deserialize"
STDERR_LOG_ENV = "AOTC_STDERR_LOG"
# The dynamo bridge re-adds these two itself after its reset; banking them
# would count them twice.
RESTORED_BY_DYNAMO = ("UncachedCompile", "DynamoExtractCompiledGraph")
COUNTER_NAMES = (
    "PersistentCacheMiss",
    "PersistentCacheHit",
    "PersistentCacheDeserializeFailure",
    "UncachedCompile",
    "CachedCompile",
    "DynamoExtractCompiledGraph",
)

FileStat = tuple[int, int, int]


def snapshot(root: str, subdir: str = "") -> dict[str, FileStat]:
    """rel-path -> (inode, mtime_ns, size) of every regular file under root/subdir."""
    out: dict[str, FileStat] = {}
    base = os.path.join(root, subdir) if subdir else root
    for dirpath, _, files in os.walk(base):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:  # erased between listing and stat
                continue
            out[os.path.relpath(path, root).replace(os.sep, "/")] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


def diff(before: dict[str, FileStat], after: dict[str, FileStat]) -> tuple[set[str], set[str]]:
    """(new keys, rewritten keys) between two snapshots."""
    new = {k for k in after if k not in before}
    rewritten = {k for k, v in after.items() if k in before and before[k] != v}
    return new, rewritten


class Counters:
    """torch_xla counters that survive the dynamo bridge's `clear_counters()`."""

    def __init__(self) -> None:
        import torch_xla.debug.metrics as met

        self._met = met
        self._banked: dict[str, int] = {}
        original = met.clear_counters
        if not getattr(original, "_aotc_banking", False):

            def banking_clear():
                for name, value in self._raw().items():
                    if name not in RESTORED_BY_DYNAMO:
                        self._banked[name] = self._banked.get(name, 0) + value
                return original()

            banking_clear._aotc_banking = True  # type: ignore[attr-defined]
            met.clear_counters = banking_clear

    def _raw(self) -> dict[str, int]:
        return {name: self._met.counter_value(name) or 0 for name in COUNTER_NAMES}

    def read(self) -> dict[str, float]:
        values: dict[str, float] = {n: v + self._banked.get(n, 0) for n, v in self._raw().items()}
        data = self._met.metric_data("CompileTime")
        # CompileTime accumulates nanoseconds and is never cleared by dynamo.
        values["CompileSeconds"] = data[1] / 1e9 if data else 0.0
        return values


class StderrLog:
    """Counts DESERIALIZE_MARKER lines appended to the redirected stderr file."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._offset = 0
        self._count = 0

    def count(self) -> int:
        if not self.path or not os.path.exists(self.path):
            return self._count
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
        # Only consume whole lines so a marker split across reads is not lost.
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._count += complete.count(DESERIALIZE_MARKER)
        self._offset += len(complete)
        return self._count


def window_record(phase: str, kind: str, family: str, shape: dict[str, Any], new: list[str], rewritten: list[str],
                  stats: dict[str, float], seconds: float) -> Record:
    """A window's evidence as the runners' shared Record: a new file is a graph compiled that the cache lacked; a
    rewritten one was found and failed to load (torch_xla erased it and wrote it again)."""
    loads = int(stats.get("PersistentCacheHit", 0))
    counts = FamilyRow(new_files=len(new), misses=len(new), rewritten_files=len(rewritten), loads=loads,
                       found=len(rewritten) + loads,
                       deserialize_failures=int(stats.get("PersistentCacheDeserializeFailure", 0)),
                       compiles=int(stats.get("UncachedCompile", 0)))
    return Record(phase, kind, family, shape, seconds, found=tuple(rewritten), written=tuple(new),
                  unloadable=tuple(rewritten), compile_seconds=stats.get("CompileSeconds", 0.0), counts=counts,
                  counters=stats)


@dataclasses.dataclass
class _Frame:
    files: dict[str, FileStat]
    stats: dict[str, float]
    started: float
    claimed_new: set[str] = dataclasses.field(default_factory=set)
    claimed_rewritten: set[str] = dataclasses.field(default_factory=set)
    child_stats: dict[str, float] = dataclasses.field(default_factory=dict)


class Probe:
    """Nested measurement windows over one rank's cache directory."""

    def __init__(self, root: str, subdir: str, sync=None, log_path: str | None = None) -> None:
        self.root = root
        self.subdir = subdir
        self.sync = sync or (lambda: None)
        self.counters = Counters()
        self.log = StderrLog(log_path)
        self.phase = "startup"
        self.records: list[Record] = []
        self._stack: list[_Frame] = []
        self.baseline = snapshot(root, subdir)

    def _stats(self) -> dict[str, float]:
        stats = self.counters.read()
        stats["DeserializeWarnings"] = self.log.count()
        return stats

    @contextmanager
    def window(self, kind: str, family: str, shape: dict[str, Any] | None = None) -> Iterator[dict]:
        """Measure a block. The yielded dict may be updated with shape fields."""
        shape = dict(shape or {})
        frame = _Frame(snapshot(self.root, self.subdir), self._stats(), time.perf_counter())
        self._stack.append(frame)
        try:
            yield shape
        finally:
            self.sync()
            self._stack.pop()
            self._close(frame, kind, family, shape)

    def _close(self, frame: _Frame, kind: str, family: str, shape: dict[str, Any]) -> None:
        new, rewritten = diff(frame.files, snapshot(self.root, self.subdir))
        stats_now = self._stats()
        inclusive = {k: stats_now[k] - frame.stats.get(k, 0) for k in stats_now}
        own = {k: v - frame.child_stats.get(k, 0) for k, v in inclusive.items()}
        if self._stack:
            parent = self._stack[-1]
            parent.claimed_new |= new
            parent.claimed_rewritten |= rewritten
            for k, v in inclusive.items():
                parent.child_stats[k] = parent.child_stats.get(k, 0) + v
        self.records.append(
            window_record(
                phase=self.phase,
                kind=kind,
                family=family,
                shape=shape,
                new=sorted(new - frame.claimed_new),
                rewritten=sorted(rewritten - frame.claimed_rewritten),
                stats={k: round(v, 6) for k, v in own.items()},
                seconds=round(time.perf_counter() - frame.started, 6),
            )
        )

    def unattributed(self) -> Record:
        """Files new or rewritten since the probe started that no window saw."""
        seen_new = {k for r in self.records for k in r.written}
        seen_rewritten = {k for r in self.records for k in r.unloadable}
        new, rewritten = diff(self.baseline, snapshot(self.root, self.subdir))
        return window_record(self.phase, OUTSIDE, UNATTRIBUTED, {}, sorted(new - seen_new),
                             sorted(rewritten - seen_rewritten - seen_new), {}, 0.0)
