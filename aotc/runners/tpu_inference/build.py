"""build: vLLM-TPU starts on the staging cache; every precompile call is reported with the files it wrote,
then a traffic sweep adds what serving compiles beyond warm-up. The core judges the calls against the plan
(aotc/build.py: plan_coverage)."""

from __future__ import annotations

import os
import time

from aotc.runners.flags import xla_flags
from aotc.matrix import Entry
from aotc.runners.protocol import BuildResult, Graph, Request

from . import records
from .buckets import implied_flags
from .records import Record, touched
from .session import RUNNER, Session, effective_flags


def precompile_calls(recs: list[Record]) -> list[Graph]:
    """Each `_run_compilation` call (and its warm-up pass), with the cache files it touched, in call order."""
    return [Graph(family=r["family"], shape=r["shape"], keys=touched(r), compile_seconds=r["compile_seconds"])
            for r in recs if records.is_call(r)]


def flag_error(launch_env: dict[str, str], entry: dict) -> str | None:
    """The fingerprint predicts the flags every process layout hashes (implied_flags once, collapsed by the
    twin plugin after tpu-inference's import; the twin's device count once; aotc.runners.flags.xla_flags):
    check this process hashes them."""
    expected = xla_flags(launch_env, RUNNER, entry_flags=implied_flags(Entry.from_dict(entry)))
    actual = effective_flags()
    if expected != actual:
        return (f"effective XLA flags {actual} differ from the fingerprint's {expected}: "
                "update the tpu-inference RunnerSpec's implied_flags for this tpu-inference")
    return None


def run_build(request: Request) -> BuildResult:
    if request.precompile_workers:
        # tpu-inference's own parallel precompile (CompilationManager's pool); not a cache-key input
        os.environ["NUM_PRECOMPILE_WORKERS"] = str(request.precompile_workers)
    launch_env = dict(os.environ)
    session = Session.start(request.entry, request.cache_dir, [g.model_dump() for g in request.plan])
    capture = session.records()
    result = BuildResult(calls=precompile_calls(capture),
                         startup=records.graphs_outside_calls(capture, records.STARTUP),
                         engine_start_seconds=round(session.start_seconds, 3), xla_flags=effective_flags())
    if error := flag_error(launch_env, request.entry):
        return result.model_copy(update={"error": error})
    started = time.perf_counter()
    sent = session.drive_traffic(request.seed, request.traffic)
    traffic_seconds = time.perf_counter() - started
    recs = session.records()
    return result.model_copy(update={
        "traffic_requests": sent,
        "traffic_seconds": round(traffic_seconds, 3),
        # every cache file looked up and found, every one written: the core counts reuse from these
        "cache_reads": sorted({k for r in recs for k in r["found"]}),
        "cache_writes": sorted({k for r in recs for k in r["written"]}),
        "runtime": [Graph.model_validate(g) for g in records.graphs_outside_calls(recs, records.RUNTIME)],
        "xla_compile_seconds": records.compile_seconds(recs),
        "metrics": records.totals(records.family_table(recs, {})),
    })
