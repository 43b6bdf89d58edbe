"""verify: a fresh vLLM-TPU on a private copy of the artifact cache, then seeded traffic.

JAX's persistent cache really loads, so the claim is strict: every compile request of the fresh
server — start-up, tpu-inference's precompiles, and traffic — is a persistent-cache hit (the
executable was deserialized from the artifact, not compiled), and nothing new is written. The copy
keeps the artifact untouched and makes any write visible as a new file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from aotc.runners.protocol import Request, VerifyResult

from . import records
from .records import Record
from .build import target_compiled_for
from .session import Session


def cache_files(cache_dir: str) -> set[str]:
    return {name for name in os.listdir(cache_dir) if name.endswith("-cache")}


def new_files_by_family(recs: list[Record], new: set[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in recs:
        for key in set(r["written"]) & new:
            counts[records.family_of(r)] = counts.get(records.family_of(r), 0) + 1
            new.discard(key)
    if new:  # written by something no window saw
        counts["unattributed"] = len(new)
    return counts


def missed(recs: list[Record]) -> list[dict[str, Any]]:
    """Keys looked up and absent, or written: an entry found but not loadable is written again, and is no miss."""
    return [{"family": records.family_of(r), "shape": r["shape"], "key": key}
            for r in recs for key in sorted(set(r["missing"]) | (set(r["written"]) - set(r["unloadable"])))]


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


def missed_cache(total: dict[str, int], table: dict[str, dict], counted: tuple[str, ...]) -> str | None:
    """The graphs that missed the cache, by family, judged by the ``counted`` columns."""
    if not any(total[column] for column in counted):
        return None
    fams = sorted(f for f, row in table.items() if any(row[column] for column in counted))
    return f"{max(total['misses'], total['new_files'])} graph(s) missed the cache in: {', '.join(fams)}"


# Keys only, on a host that cannot load: an entry found is compiled and written again under the same key, so a
# write is no miss there
KEYS_ONLY = ("misses", "new_files")


def verdict(total: dict[str, int], table: dict[str, dict]) -> str | None:
    problems = [miss] if (miss := missed_cache(total, table, (*KEYS_ONLY, "writes"))) else []
    if total["deserialize_failures"]:
        problems.append(f"{total['deserialize_failures']} cache entries failed to load")
    if total["uncached_compiles"]:
        fams = sorted(f for f, row in table.items() if row["uncached_compiles"])
        problems.append(f"{total['uncached_compiles']} compile(s) bypassed the persistent cache in: {', '.join(fams)}")
    return "; ".join(problems) or None


def run_verify(request: Request) -> VerifyResult:
    with tempfile.TemporaryDirectory(prefix="aotc-verify-") as scratch:
        cache = shutil.copytree(request.cache_dir, os.path.join(scratch, "cache"))
        before = cache_files(cache)
        session = Session.start(request.entry, cache, [g.model_dump() for g in request.plan])
        sent = session.drive_traffic(request.seed, request.traffic)
        recs = session.records()
        new = cache_files(cache) - before

    always = (*dict.fromkeys(p.family for p in request.plan), records.STARTUP, records.RUNTIME)
    table = records.family_table(recs, new_files_by_family(recs, set(new)), always)
    total = records.totals(table)
    target = target_compiled_for(request.entry)
    return VerifyResult(
        families=table,
        misses=max(total["misses"], total["new_files"]),
        missed=missed(recs),
        replayed_graphs=total["found"],
        traffic_requests=sent,
        # A hit is an executable deserialized from the artifact: a real load, not a promise.
        loadable=not target and total["found"] > 0 and total["found"] == total["requests"]
        and not total["deserialize_failures"],
        unproven=target and (f"built on a host without a TPU for {target['topology']} ({target['device_kind']}); "
                             f"`aotc verify` on a {target['accelerator']} host shows the load"),
        engine_start_seconds=round(session.start_seconds, 3),
        evidence=compile_only_evidence(total, len(before), target) if target else evidence(total, len(before)),
        metrics=total,
        error=missed_cache(total, table, KEYS_ONLY) if target else verdict(total, table),
    )
