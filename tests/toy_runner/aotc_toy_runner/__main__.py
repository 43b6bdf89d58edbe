"""python -m aotc_toy_runner {build|verify} REQUEST.json RESULT.json (aotc/runners/protocol.py)."""

from __future__ import annotations

import os
import time

from aotc.runners.protocol import (BuildResult, FamilyRow, Graph, Missed, Mode, Request, VerifyResult,
                                   report_progress, runner_main)

from .buckets import cache_file


def build(request: Request) -> BuildResult:
    calls = []
    skip = os.environ.get("AOTC_TOY_SKIP")  # a family this "stack" fails to compile, for the failure path
    for graph in request.plan:
        if graph.family == skip:
            continue
        started = time.perf_counter()
        name = cache_file(graph.family, graph.shape)
        with open(os.path.join(request.cache_dir, name), "w") as fh:
            # request.entry arrives as the Entry itself (typed, not the wire's dict)
            fh.write(f"{request.entry.name}: {graph.family} {graph.shape} salt={os.environ.get('AOTC_TOY_SALT', '')}\n")
        calls.append(Graph(family=graph.family, shape=graph.shape, keys=[name],
                           compile_seconds=time.perf_counter() - started))
    for family in dict.fromkeys(g.family for g in request.plan):
        report_progress(family, sum(c.compile_seconds for c in calls if c.family == family))
    return BuildResult(calls=calls, traffic_requests=0, xla_compile_seconds=sum(c.compile_seconds for c in calls))


def verify(request: Request) -> VerifyResult:
    families: dict[str, FamilyRow] = {}
    missed = []
    for graph in request.plan:
        row = families.setdefault(graph.family, FamilyRow())
        name = cache_file(graph.family, graph.shape)
        row.requests += 1
        if os.path.isfile(os.path.join(request.cache_dir, name)):
            row.found += 1
            row.loads += 1
        else:
            row.misses += 1
            missed.append(Missed(family=graph.family, shape=graph.shape, key=name))
    found = sum(r.found for r in families.values())
    error = f"{len(missed)} graph(s) missed the cache" if missed else None
    return VerifyResult(families=families, misses=len(missed), missed=missed, replayed_graphs=found,
                        loadable=found > 0 and not missed, evidence=f"read back {found} toy cache files",
                        error=error)


def run(mode: Mode, request: Request) -> BuildResult | VerifyResult:
    return build(request) if mode == "build" else verify(request)


if __name__ == "__main__":
    raise SystemExit(runner_main("python -m aotc_toy_runner", run))
