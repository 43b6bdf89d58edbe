"""Worker records (aotc/runners/records.py: Record) -> the graphs and shapes the core talks about, as torch_xla's
worker reports them. Pure data shuffling (no torch), shared by build and verify.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

from aotc.runners.protocol import Graph
from aotc.runners.records import CALL, FAMILY, OUTSIDE, RUNTIME, STARTUP, STEP, Record, compile_seconds, touched

from . import engine


def worker_records(llm: Any) -> tuple[list[Record], dict[str, Any]]:
    """All ranks' records and summed counters; the records cross from the worker processes as plain data."""
    recs, counters = engine.worker_records(llm)
    return [Record.from_dict(r) for r in recs], counters


def display_shape(record: Record) -> dict[str, Any]:
    if record.phase == STARTUP:
        return {"what": record.family}
    if record.kind == FAMILY:
        return {"outside_call": True}
    return record.shape


def with_runtime_context(records: Iterable[Record]) -> Iterator[Record]:
    """Give runtime graph calls the shape of the step they ran in.

    Records are emitted when a window closes, so a call's record precedes the
    record of the step that contains it.
    """
    pending: list[Record] = []
    for record in records:
        if record.phase != RUNTIME or record.kind not in (CALL, STEP):
            yield record
            continue
        if record.kind == CALL:
            pending.append(record)
            continue
        step = record.shape
        for call in pending:
            yield dataclasses.replace(call, shape={**step, "what": f"{step.get('what')}/{call.family}",
                                                   "call_shape": call.shape})
        pending.clear()
        yield record
    yield from pending


def runtime_graphs(records: list[Record]) -> list[Graph]:
    return [Graph(family=RUNTIME, shape=r.shape, keys=touched(r), compile_seconds=compile_seconds([r]))
            for r in with_runtime_context(records) if r.phase == RUNTIME and r.kind in (CALL, STEP) and touched(r)]


def startup_graphs(records: list[Record]) -> list[Graph]:
    return [Graph(family=STARTUP, shape=display_shape(r), keys=touched(r), compile_seconds=compile_seconds([r]))
            for r in records if r.phase == STARTUP and r.kind != OUTSIDE and touched(r)]
