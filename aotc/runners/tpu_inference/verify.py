"""verify: a fresh vLLM-TPU on a private copy of the artifact cache, then seeded traffic.

JAX's persistent cache really loads, so the claim is strict: every compile request of the fresh
server — start-up, tpu-inference's precompiles, and traffic — is a persistent-cache hit (the
executable was deserialized from the artifact, not compiled), and nothing new is written. The copy
keeps the artifact untouched and makes any write visible as a new file (aotc/runners/records.py: run_verify).
"""

from __future__ import annotations

import os
from typing import Any

from aotc.runners import records
from aotc.runners.protocol import FamilyRow, Request, VerifyResult
from aotc.runners.records import Judgement, Record, Replay, missed_cache

from .build import target_compiled_for
from .session import Session


def cache_files(cache_dir: str) -> set[str]:
    return {name for name in os.listdir(cache_dir) if name.endswith("-cache")}


def new_files_by_family(recs: list[Record], new: set[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in recs:
        for key in set(r.written) & new:
            counts[records.family_of(r)] = counts.get(records.family_of(r), 0) + 1
            new.discard(key)
    if new:  # written by something no window saw
        counts[records.UNATTRIBUTED] = len(new)
    return counts


def evidence(total: dict[str, int], artifact_files: int) -> str:
    return (f"A fresh vLLM-TPU (tpu-inference, JAX) ran start-up, its precompiles and the traffic on a writable "
            f"copy of the {artifact_files} artifact cache files. JAX monitoring: {total['requests']} compile "
            f"requests used the persistent cache, {total['found']} were hits (executables deserialized from the "
            f"artifact, not compiled), {total['writes']} entries written; {total['compiles']} XLA compile(s), of "
            f"which {total['uncached_compiles']} bypassed the persistent cache; {total['new_files']} new file(s) in "
            f"the cache dir; {total['deserialize_failures']} entries failed to load.")


def compile_only_evidence(total: dict[str, int], artifact_files: int, target: dict[str, Any]) -> str:
    return (f"A fresh vLLM-TPU (tpu-inference, JAX) started on the compile-only devices of {target['topology']} "
            f"({target['device_kind']}, libtpu's TPU compiler; this host has no TPU) on a copy of the "
            f"{artifact_files} artifact cache files and ran its start-up and precompiles: {total['requests']} "
            f"compile requests used the persistent cache, {total['found']} found their key in the artifact, "
            f"{total['misses']} did not; {total['new_files']} new file(s) in the cache dir. A compile-only client "
            "loads nothing, so the keys are proven here and the load is not.")


# Keys only, on a host that cannot load: an entry found is compiled and written again under the same key, so a
# write is no miss there
KEYS_ONLY = ("misses", "new_files")


def verdict(total: dict[str, int], table: dict[str, FamilyRow]) -> str | None:
    problems = [miss] if (miss := missed_cache(total, table, (*KEYS_ONLY, "writes"))) else []
    if total["deserialize_failures"]:
        problems.append(f"{total['deserialize_failures']} cache entries failed to load")
    if total["uncached_compiles"]:
        fams = sorted(f for f, row in table.items() if row.uncached_compiles)
        problems.append(f"{total['uncached_compiles']} compile(s) bypassed the persistent cache in: {', '.join(fams)}")
    return "; ".join(problems) or None


def replay(request: Request, cache: str) -> Replay:
    before = cache_files(cache)
    session = Session.start(request.entry, cache, [g.model_dump() for g in request.plan])
    sent = session.drive_traffic(request.seed, request.traffic)
    recs = session.records()
    new = cache_files(cache) - before
    return Replay(recs, sent, session.start_seconds, len(before), new_files_by_family(recs, new))


def judge(request: Request, seen: Replay, table: dict[str, FamilyRow], total: dict[str, int]) -> Judgement:
    target = target_compiled_for(request.entry)
    if target:
        return Judgement(
            loadable=False, evidence=compile_only_evidence(total, seen.artifact_files, target), metrics=total,
            error=missed_cache(total, table, KEYS_ONLY),
            unproven=(f"built on a host without a TPU for {target['topology']} ({target['device_kind']}); "
                      f"`aotc verify` on a {target['accelerator']} host shows the load"))
    return Judgement(
        # A hit is an executable deserialized from the artifact: a real load, not a promise.
        loadable=total["found"] > 0 and total["found"] == total["requests"] and not total["deserialize_failures"],
        evidence=evidence(total, seen.artifact_files), metrics=total, error=verdict(total, table))


def run_verify(request: Request) -> VerifyResult:
    return records.run_verify(request, replay, judge, always=(records.STARTUP, records.RUNTIME))
