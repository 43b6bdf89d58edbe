"""build: vLLM-TPU starts on the staging cache, every planned precompile is tied to the files it wrote,
then a traffic sweep adds what serving compiles beyond warm-up."""

from __future__ import annotations

import os
from typing import Any

from aotc.fingerprint import xla_flags

from aotc.matrix import Entry

from . import records
from .buckets import implied_flags
from .records import Record, shape_key, touched
from .session import RUNNER, Session, effective_flags


def match_plan(plan: list[dict], recs: list[Record]) -> tuple[list[dict], list[dict], list[str]]:
    """(graphs in plan order with their keys, unplanned precompiles, errors)."""
    calls: dict[str, list[Record]] = {}
    for r in recs:
        if records.is_call(r):
            calls.setdefault(shape_key(r["family"], r["shape"]), []).append(r)
    graphs, errors = [], []
    for item in plan:
        matched = calls.get(shape_key(item["family"], item["shape"]), [])
        keys = sorted({k for r in matched for k in touched(r)})
        graphs.append({**item, "keys": keys, "compile_seconds": records.compile_seconds(matched)})
        if not matched:
            errors.append(f"planned graph {item['family']} {item['shape']} was never precompiled by tpu-inference")
        elif not keys:
            errors.append(f"planned graph {item['family']} {item['shape']} produced no cache file")
    planned = {shape_key(i["family"], i["shape"]) for i in plan}
    unplanned = [{"family": r["family"], "shape": r["shape"], "keys": touched(r)}
                 for r in recs if records.is_call(r) and shape_key(r["family"], r["shape"]) not in planned]
    errors += [f"tpu-inference precompiled unplanned graph {u['family']} {u['shape']}" for u in unplanned]
    return graphs, unplanned, errors


def flag_error(launch_env: dict[str, str], entry: dict[str, Any]) -> str | None:
    """The fingerprint predicts the flags tpu-inference and the twin add (RUNNER_IMPLIED_FLAGS and
    buckets.implied_flags); check they did."""
    expected = xla_flags(launch_env, RUNNER, implied_flags(Entry.from_dict(entry)))
    actual = effective_flags()
    if expected != actual:
        return (f"effective XLA flags {actual} differ from the fingerprint's {expected}: "
                "update aotc.fingerprint.RUNNER_IMPLIED_FLAGS for this tpu-inference")
    return None


def run_build(request: dict[str, Any]) -> dict[str, Any]:
    entry, seed = request["entry"], int(request.get("seed", 0))
    if request.get("precompile_workers"):
        # tpu-inference's own parallel precompile (CompilationManager's pool); not a cache-key input
        os.environ["NUM_PRECOMPILE_WORKERS"] = str(int(request["precompile_workers"]))
    launch_env = dict(os.environ)
    session = Session.start(entry, request["cache_dir"])
    capture = session.records()
    graphs, unplanned, errors = match_plan(request["plan"], capture)
    result: dict[str, Any] = {
        "graphs": graphs,
        "unplanned": unplanned,
        "startup": records.graphs_outside_calls(capture, records.STARTUP),
        "engine_start_seconds": round(session.start_seconds, 3),
        "xla_flags": effective_flags(),
    }
    if error := flag_error(launch_env, entry):
        errors.append(error)
    if errors:
        return {**result, "error": "; ".join(errors)}
    result["traffic_requests"] = session.drive_traffic(seed, int(request.get("traffic", 32)))
    recs = session.records()
    result.update(
        # every cache file looked up and found, every one written: the core counts reuse from these
        cache_reads=sorted({k for r in recs for k in r["found"]}),
        cache_writes=sorted({k for r in recs for k in r["written"]}),
        runtime=records.graphs_outside_calls(recs, records.RUNTIME),
        xla_compile_seconds=records.compile_seconds(recs),
        metrics=records.totals(records.family_table(recs, {})),
    )
    return result
