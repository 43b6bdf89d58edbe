"""build: start vLLM on the staging cache, report every capture call with the files it wrote, sweep traffic.

The core judges the calls against the plan (aotc/build.py: plan_coverage); this runner only reports.
"""

from __future__ import annotations

from aotc.runners.protocol import BuildResult, Graph, Request
from aotc.runners.records import CALL, CAPTURE, OUTSIDE, Record, compile_seconds, touched

from . import engine, records, traffic


def capture_calls(recs: list[Record]) -> list[Graph]:
    """Each graph call capture_model made, with the cache files it wrote, in call order."""
    return [Graph(family=r.family, shape=r.shape, keys=touched(r), compile_seconds=compile_seconds([r]))
            for r in recs if r.phase == CAPTURE and r.kind == CALL]


def capture_outside(recs: list[Record]) -> list[Graph]:
    """Cache files capture_model wrote outside any graph call (a family's own code, the phase itself)."""
    return [Graph(family=r.family, shape=records.display_shape(r), keys=touched(r))
            for r in recs if r.phase == CAPTURE and r.kind != CALL and touched(r)]


def run_build(request: Request) -> BuildResult:
    entry = request.entry
    llm, start_seconds = engine.start_engine(entry, request.cache_dir, request.seed)
    capture_records, _ = records.worker_records(llm)
    batches = traffic.plan_traffic(request.seed, request.traffic, entry, llm)
    sent = traffic.run_traffic(llm, batches)
    recs, counters = records.worker_records(llm)
    outside = [r for r in recs if r.kind == OUTSIDE and touched(r)]
    return BuildResult(
        calls=capture_calls(capture_records),
        capture_outside=capture_outside(capture_records),
        startup=records.startup_graphs(capture_records),
        runtime=records.runtime_graphs(recs),
        unattributed=sorted({k for r in outside for k in touched(r)}),
        traffic_requests=sent,
        engine_start_seconds=round(start_seconds, 3),
        xla_compile_seconds=round(counters.get("CompileSeconds", 0.0), 3),
        metrics=counters,
    )
