"""verify: a fresh vLLM on a copy of the artifact cache, then seeded traffic.

The artifact is never opened by vLLM: it is copied into a private directory
that vLLM may write, so that any graph not in the artifact shows up as a new
file — the same writable cache a pod gets, and evidence that cannot miss a
compile that reaches the persistent cache. The copy doubles as a load probe:
torch_xla erases and rewrites a file it found but could not deserialize.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from aotc.runners.protocol import ROW_FIELDS, Request, VerifyResult

from . import engine, records, traffic
from .probe import snapshot
from .records import Record

def family_table(recs: list[Record], always: tuple[str, ...] = ()) -> dict[str, dict[str, int]]:
    """Per-family evidence; families with none are listed only if in `always`."""
    table: dict[str, dict[str, int]] = {name: dict.fromkeys(ROW_FIELDS, 0) for name in always}
    for r in recs:
        row = table.setdefault(records.family_of(r), dict.fromkeys(ROW_FIELDS, 0))
        loads = int(r["stats"].get("PersistentCacheHit", 0))
        row["new_files"] += len(r["new"])
        row["misses"] += len(r["new"])
        row["rewritten_files"] += len(r["rewritten"])
        row["loads"] += loads
        row["found"] += len(r["rewritten"]) + loads
        row["deserialize_failures"] += int(r["stats"].get("PersistentCacheDeserializeFailure", 0))
        row["compiles"] += int(r["stats"].get("UncachedCompile", 0))
    return {name: row for name, row in table.items() if name in always or any(row.values())}


def missed(recs: list[Record]) -> list[dict[str, Any]]:
    return [
        {"family": records.family_of(r), "shape": records.display_shape(r), "key": key}
        for r in records.with_runtime_context(recs)
        for key in r["new"]
    ]


def evidence(table: dict, counters: dict, cache_files: int, warnings: int) -> str:
    total = {f: sum(row[f] for row in table.values()) for f in ROW_FIELDS}
    lines = [
        f"Watched a writable copy of the {cache_files} artifact cache files during vLLM start-up "
        f"(capture_model) and traffic: {total['new_files']} new file(s) = graphs compiled that the "
        f"artifact lacks (misses); {total['rewritten_files']} file(s) found but erased and rewritten by "
        "torch_xla after failing to deserialize.",
        f"torch_xla counters, accumulated across dynamo's counter resets: PersistentCacheMiss="
        f"{int(counters.get('PersistentCacheMiss', 0))}, PersistentCacheHit={int(counters.get('PersistentCacheHit', 0))}, "
        f"PersistentCacheDeserializeFailure={int(counters.get('PersistentCacheDeserializeFailure', 0))}, "
        f"UncachedCompile={int(counters.get('UncachedCompile', 0))}; "
        f"'Failed to deserialize' lines on stderr: {warnings}.",
    ]
    if total["loads"] == 0:
        lines.append("No executable was loaded from the cache: every cached graph was recompiled in this process.")
    if total["deserialize_failures"] != total["rewritten_files"]:
        lines.append(
            f"Cross-check mismatch: {total['deserialize_failures']} deserialize failures counted vs "
            f"{total['rewritten_files']} rewritten files."
        )
    unexplained = total["compiles"] - total["new_files"] - total["rewritten_files"]
    if unexplained:
        lines.append(
            f"{total['compiles']} XLA compiles (UncachedCompile) vs {total['new_files']} new + "
            f"{total['rewritten_files']} rewritten files: {unexplained} compile(s) left no trace in the cache."
        )
    if int(counters.get("PersistentCacheMiss", 0)) != total["new_files"]:
        lines.append(
            f"Cross-check mismatch: PersistentCacheMiss={int(counters.get('PersistentCacheMiss', 0))} vs "
            f"{total['new_files']} new files; the verdict uses the files."
        )
    return " ".join(lines)


def run_verify(request: Request) -> VerifyResult:
    entry, seed = request.entry, request.seed
    with tempfile.TemporaryDirectory(prefix="aotc-verify-") as scratch:
        cache = shutil.copytree(request.cache_dir, f"{scratch}/cache")
        cache_files = len(snapshot(cache))
        llm, start_seconds = engine.start_engine(entry, cache, seed)
        batches = traffic.plan_traffic(seed, request.traffic, entry, llm)
        sent = traffic.run_traffic(llm, batches)
        recs, counters = engine.worker_records(llm)

    table = family_table(recs, always=(*dict.fromkeys(p.family for p in request.plan), records.RUNTIME))
    total_misses = sum(row["misses"] for row in table.values())
    loads = sum(row["loads"] for row in table.values())
    failures = sum(row["deserialize_failures"] + row["rewritten_files"] for row in table.values())
    warnings = int(sum(r["stats"].get("DeserializeWarnings", 0) for r in recs))
    missed_graphs = missed(recs)
    return VerifyResult(
        families=table,
        misses=total_misses,
        missed=missed_graphs,
        replayed_graphs=sum(row["found"] for row in table.values()),
        traffic_requests=sent,
        # Only a load that happened counts; torch_xla 2.9 cannot load its cache
        # (pytorch/xla#9094), so expect False there.
        loadable=loads > 0 and failures == 0,
        engine_start_seconds=round(start_seconds, 3),
        evidence=evidence(table, counters, cache_files, warnings),
        metrics=counters,
        error=verdict(table, missed_graphs),
    )


def verdict(table: dict[str, dict[str, int]], missed_graphs: list[dict]) -> str | None:
    """Failure message, or None. Rests on files and the compile counter only.

    A new file is a graph the artifact lacks. A compile that neither wrote a
    new file nor rewrote a failed-to-load one went around the persistent
    cache, so no artifact can spare a pod that compile either.
    """
    problems = []
    misses = sum(row["misses"] for row in table.values())
    if misses:
        fams = sorted({m["family"] for m in missed_graphs})
        problems.append(f"{misses} graph(s) missed the cache in: {', '.join(fams)}")
    stray = {
        name: row["compiles"] - row["new_files"] - row["rewritten_files"]
        for name, row in table.items()
        if row["compiles"] > row["new_files"] + row["rewritten_files"]
    }
    if stray:
        problems.append(f"compiles that bypassed the persistent cache: {stray}")
    return "; ".join(problems) or None
