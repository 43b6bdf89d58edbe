"""One vocabulary for what a runner observed, shared by every backend: a probe window's ``Record``, verify's
per-family table (rows are ``protocol.FamilyRow``, the table the core reads) and the verify template.

A backend's probe turns what its stack reports (JAX's monitoring events and cache lookups; torch_xla's counters
and the cache directory's changes) into ``Record``s; its build and verify read only these. Pure data: no stack
imports.

Windows nest and evidence goes to the innermost open one. A window is a ``PHASE`` (evidence outside any call),
a ``FAMILY`` (a graph family's own code outside its graph calls), a ``CALL`` (one graph, by family and shape), a
``STEP`` (a serving step) or ``OUTSIDE`` (files no window saw change).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aotc.runners.protocol import ROW_FIELDS, FamilyRow, Missed, Request, VerifyResult

# Phases, and the families verify counts beyond the plan's (the manifest's STARTUP and RUNTIME)
STARTUP = "startup"
CAPTURE = "capture"
RUNTIME = "runtime"
UNATTRIBUTED = "unattributed"
CAPTURE_OUTSIDE_FAMILY = "capture_model"

PHASE, FAMILY, CALL, STEP, OUTSIDE = "phase", "family", "call", "step", "outside"

Shape = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Record:
    """What one window saw: the cache files it touched and its evidence in verify's row vocabulary."""

    phase: str  # startup | capture | runtime
    kind: str  # phase | family | call | step | outside
    family: str
    shape: Shape
    seconds: float = 0.0
    found: tuple[str, ...] = ()
    """Cache files looked up and present (loadable or not)."""
    missing: tuple[str, ...] = ()
    """Cache files looked up and absent."""
    written: tuple[str, ...] = ()
    """Cache files written that the cache did not hold."""
    unloadable: tuple[str, ...] = ()
    """Cache files found that this process could not load (JAX compiles and writes the key again; torch_xla erases
    and rewrites the file)."""
    compile_seconds: float = 0.0
    counts: FamilyRow = dataclasses.field(default_factory=FamilyRow)
    """This window's share of its family's row in verify's table (``family_table``)."""
    compiled: tuple[dict[str, int], ...] = ()
    """The compiler's figures of each executable compiled for a TPU target on a host without one."""
    counters: dict[str, float] = dataclasses.field(default_factory=dict)
    """The stack's own counters over the window, as its probe read them (torch_xla's)."""

    def as_dict(self) -> dict[str, Any]:
        """Plain data, for a record that crosses a process boundary (``from_dict`` reads it back)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)} | {
            "counts": self.counts.model_dump()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Record:
        keys = {name: tuple(data.get(name, ())) for name in ("found", "missing", "written", "unloadable", "compiled")}
        return cls(**{**data, **keys, "counts": FamilyRow.model_validate(data.get("counts", {}))})


def touched(record: Record) -> list[str]:
    """Cache files a window wrote or found."""
    return sorted(set(record.written) | set(record.found))


def family_of(record: Record) -> str:
    """The row of verify's table a record's evidence goes to: a graph call's (or a family window's) own family
    while the stack warms up; serving's, start-up's, or the warm-up's own code outside any family."""
    if record.kind == OUTSIDE:
        return UNATTRIBUTED
    if record.phase == RUNTIME or record.kind == STEP:
        return RUNTIME
    if record.kind == PHASE:
        return STARTUP if record.phase == STARTUP else CAPTURE_OUTSIDE_FAMILY
    return record.family


def compile_seconds(records: Iterable[Record]) -> float:
    return round(sum(r.compile_seconds for r in records), 3)


def family_table(records: Iterable[Record], always: Iterable[str] = (),
                 new_files: Mapping[str, int] | None = None) -> dict[str, FamilyRow]:
    """Per family, the sum of its records' counts (plus ``new_files``, counted by the caller where the records
    cannot: files new in the cache directory, by family); a family with no evidence only if in ``always``."""
    always = tuple(always)
    sums = {name: dict.fromkeys(ROW_FIELDS, 0) for name in always}
    for r in records:
        row = sums.setdefault(family_of(r), dict.fromkeys(ROW_FIELDS, 0))
        for field, value in r.counts:
            row[field] += value
    for family, count in (new_files or {}).items():
        sums.setdefault(family, dict.fromkeys(ROW_FIELDS, 0))["new_files"] += count
    return {name: FamilyRow(**row) for name, row in sums.items() if name in always or any(row.values())}


def totals(table: Mapping[str, FamilyRow]) -> dict[str, int]:
    return {f: sum(getattr(row, f) for row in table.values()) for f in ROW_FIELDS}


def own_shape(record: Record) -> Shape:
    return record.shape


def missed(records: Iterable[Record], shown: Callable[[Record], Shape] = own_shape) -> list[Missed]:
    """Each key a window looked up and did not find, or wrote: an entry found but not loadable is written again,
    and is no miss. ``shown``: the shape verify names the graph by."""
    return [Missed(family=family_of(r), shape=shown(r), key=key)
            for r in records for key in sorted(set(r.missing) | (set(r.written) - set(r.unloadable)))]


def missed_cache(total: Mapping[str, int], table: Mapping[str, FamilyRow],
                 counted: tuple[str, ...] = ("misses", "new_files")) -> str | None:
    """The graphs that missed the cache, by family, judged by the ``counted`` columns."""
    if not any(total[column] for column in counted):
        return None
    fams = sorted(f for f, row in table.items() if any(getattr(row, column) for column in counted))
    return f"{max(total['misses'], total['new_files'])} graph(s) missed the cache in: {', '.join(fams)}"


# -- the verify template ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Replay:
    """What a fresh engine did on a writable copy of the artifact cache: start-up, warm-up and the traffic."""

    records: list[Record]
    traffic_requests: int
    start_seconds: float
    artifact_files: int
    new_files: dict[str, int] = dataclasses.field(default_factory=dict)
    """Files new in the copy by family, where the records do not count them (``family_table``)."""
    counters: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Judgement:
    """A backend's reading of the table: whether the artifact loaded, its evidence line, its failure."""

    loadable: bool
    evidence: str
    error: str | None
    metrics: dict[str, Any]
    unproven: str | None = None


def run_verify(request: Request, replay: Callable[[Request, str], Replay],
               judge: Callable[[Request, Replay, dict[str, FamilyRow], dict[str, int]], Judgement],
               always: tuple[str, ...] = (RUNTIME,), shown: Callable[[Record], Shape] = own_shape) -> VerifyResult:
    """Replay on a private copy of the artifact cache (the artifact stays untouched, and any graph it lacks shows
    as a new file in the copy), count per family (the plan's families and ``always`` listed even when empty), and
    let the backend judge."""
    with tempfile.TemporaryDirectory(prefix="aotc-verify-") as scratch:
        seen = replay(request, shutil.copytree(request.cache_dir, os.path.join(scratch, "cache")))
    table = family_table(seen.records, (*dict.fromkeys(p.family for p in request.plan), *always), seen.new_files)
    total = totals(table)
    judged = judge(request, seen, table, total)
    return VerifyResult(
        families=table,
        misses=max(total["misses"], total["new_files"]),
        missed=missed(seen.records, shown),
        replayed_graphs=total["found"],
        traffic_requests=seen.traffic_requests,
        loadable=judged.loadable,
        unproven=judged.unproven,
        engine_start_seconds=round(seen.start_seconds, 3),
        evidence=judged.evidence,
        metrics=judged.metrics,
        error=judged.error,
    )
