"""verify: a fresh vLLM on a copy of the artifact cache, then seeded traffic.

The artifact is never opened by vLLM: it is copied into a private directory
that vLLM may write (aotc/runners/records.py: run_verify), so that any graph not
in the artifact shows up as a new file — the same writable cache a pod gets, and
evidence that cannot miss a compile that reaches the persistent cache. The copy
doubles as a load probe: torch_xla erases and rewrites a file it found but could
not deserialize.
"""

from __future__ import annotations

from aotc.runners import records as shared
from aotc.runners.protocol import FamilyRow, Request, VerifyResult
from aotc.runners.records import Judgement, Replay, missed_cache

from . import engine, records, traffic
from .probe import snapshot


def evidence(total: dict[str, int], counters: dict, cache_files: int, warnings: int) -> str:
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


def verdict(table: dict[str, FamilyRow]) -> str | None:
    """Failure message, or None. Rests on files and the compile counter only.

    A new file is a graph the artifact lacks. A compile that neither wrote a
    new file nor rewrote a failed-to-load one went around the persistent
    cache, so no artifact can spare a pod that compile either.
    """
    problems = [miss] if (miss := missed_cache(shared.totals(table), table)) else []
    stray = {
        name: row.compiles - row.new_files - row.rewritten_files
        for name, row in table.items()
        if row.compiles > row.new_files + row.rewritten_files
    }
    if stray:
        problems.append(f"compiles that bypassed the persistent cache: {stray}")
    return "; ".join(problems) or None


def replay(request: Request, cache: str) -> Replay:
    cache_files = len(snapshot(cache))
    llm, start_seconds = engine.start_engine(request.entry, cache, request.seed)
    batches = traffic.plan_traffic(request.seed, request.traffic, request.entry, llm)
    sent = traffic.run_traffic(llm, batches)
    recs, counters = records.worker_records(llm)
    # a runtime graph call is named by the step it ran in
    return Replay(list(records.with_runtime_context(recs)), sent, start_seconds, cache_files, counters=counters)


def judge(request: Request, seen: Replay, table: dict[str, FamilyRow], total: dict[str, int]) -> Judgement:
    warnings = int(sum(r.counters.get("DeserializeWarnings", 0) for r in seen.records))
    return Judgement(
        # Only a load that happened counts; torch_xla 2.9 cannot load its cache
        # (pytorch/xla#9094), so expect False there.
        loadable=total["loads"] > 0 and total["deserialize_failures"] + total["rewritten_files"] == 0,
        evidence=evidence(total, seen.counters, seen.artifact_files, warnings),
        metrics=seen.counters,
        error=verdict(table),
    )


def run_verify(request: Request) -> VerifyResult:
    return shared.run_verify(request, replay, judge, shown=records.display_shape)
