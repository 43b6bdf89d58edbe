"""Worker measurement records -> the families and shapes the core talks about.

Pure data shuffling (no torch), shared by build and verify.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

Record = dict[str, Any]

STARTUP = "startup"
RUNTIME = "runtime"
UNATTRIBUTED = "unattributed"
CAPTURE_OUTSIDE_FAMILY = "capture_model"


def touched(record: Record) -> list[str]:
    """Keys a window wrote or found: new files plus files rewritten in place."""
    return sorted(set(record["new"]) | set(record["rewritten"]))


def family_of(record: Record) -> str:
    """Family a record's evidence belongs to in verify's per-family table."""
    if record["kind"] == "outside":
        return UNATTRIBUTED
    if record["phase"] == STARTUP:
        return STARTUP
    if record["phase"] == RUNTIME:
        return RUNTIME
    return CAPTURE_OUTSIDE_FAMILY if record["kind"] == "phase" else record["family"]


def display_shape(record: Record) -> dict[str, Any]:
    if record["phase"] == STARTUP:
        return {"what": record["family"]}
    if record["kind"] == "family":
        return {"outside_call": True}
    return record["shape"]


def with_runtime_context(records: Iterable[Record]) -> Iterator[Record]:
    """Give runtime graph calls the shape of the step they ran in.

    Records are emitted when a window closes, so a call's record precedes the
    record of the step that contains it.
    """
    pending: list[Record] = []
    for record in records:
        if record["phase"] != RUNTIME or record["kind"] not in ("call", "step"):
            yield record
            continue
        if record["kind"] == "call":
            pending.append(record)
            continue
        step = record["shape"]
        for call in pending:
            yield {**call, "shape": {**step, "what": f"{step.get('what')}/{call['family']}", "call_shape": call["shape"]}}
        pending.clear()
        yield record
    yield from pending


def compile_seconds(records: Iterable[Record]) -> float:
    return round(sum(r["stats"].get("CompileSeconds", 0.0) for r in records), 3)


def runtime_graphs(records: list[Record]) -> list[dict[str, Any]]:
    return [
        {"family": RUNTIME, "shape": r["shape"], "keys": touched(r), "compile_seconds": compile_seconds([r])}
        for r in with_runtime_context(records)
        if r["phase"] == RUNTIME and r["kind"] in ("call", "step") and touched(r)
    ]


def startup_graphs(records: list[Record]) -> list[dict[str, Any]]:
    return [
        {"family": STARTUP, "shape": display_shape(r), "keys": touched(r), "compile_seconds": compile_seconds([r])}
        for r in records
        if r["phase"] == STARTUP and r["kind"] != "outside" and touched(r)
    ]
