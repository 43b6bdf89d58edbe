"""build: start vLLM on the staging cache, tie every file to a planned graph, sweep traffic."""

from __future__ import annotations

from typing import Any

from . import engine, records, traffic
from .records import Record, shape_key, touched


def match_plan(plan: list[dict], recs: list[Record]) -> tuple[list[dict], list[dict], list[str]]:
    """(graphs in plan order, unplanned capture compiles, errors)."""
    calls: dict[str, list[Record]] = {}
    for r in recs:
        if r["phase"] == "capture" and r["kind"] == "call":
            calls.setdefault(shape_key(r["family"], r["shape"]), []).append(r)

    graphs, errors = [], []
    for item in plan:
        matched = calls.get(shape_key(item["family"], item["shape"]), [])
        keys = sorted({k for r in matched for k in touched(r)})
        graphs.append({**item, "keys": keys, "compile_seconds": records.compile_seconds(matched)})
        if not matched:
            errors.append(f"planned graph {item['family']} {item['shape']} was never called by capture_model")
        elif not keys:
            errors.append(f"planned graph {item['family']} {item['shape']} produced no cache file")

    planned = {shape_key(i["family"], i["shape"]) for i in plan}
    unplanned = [
        {"family": r["family"], "shape": records.display_shape(r), "keys": touched(r)}
        for r in recs
        if r["phase"] == "capture"
        and touched(r)
        and not (r["kind"] == "call" and shape_key(r["family"], r["shape"]) in planned)
    ]
    errors += [f"capture compiled unplanned graph {u['family']} {u['shape']}: {u['keys']}" for u in unplanned]
    return graphs, unplanned, errors


def run_build(request: dict[str, Any]) -> dict[str, Any]:
    entry = request["entry"]
    seed = int(request.get("seed", 0))
    llm, start_seconds = engine.start_engine(entry, request["cache_dir"], seed)
    capture_records, _ = engine.worker_records(llm)
    graphs, unplanned, errors = match_plan(request["plan"], capture_records)
    result: dict[str, Any] = {
        "graphs": graphs,
        "unplanned": unplanned,
        "startup": records.startup_graphs(capture_records),
        "engine_start_seconds": round(start_seconds, 3),
    }
    if errors:
        return {**result, "error": "; ".join(errors)}

    batches = traffic.plan_traffic(seed, int(request.get("traffic", 32)), entry, engine.vocab_size(llm))
    result["traffic_requests"] = traffic.run_traffic(llm, batches)
    recs, counters = engine.worker_records(llm)
    outside = [r for r in recs if r["kind"] == "outside" and touched(r)]
    result.update(
        runtime=records.runtime_graphs(recs),
        unattributed=sorted({k for r in outside for k in touched(r)}),
        xla_compile_seconds=round(counters.get("CompileSeconds", 0.0), 3),
        metrics=counters,
    )
    return result
