"""``aotc build``: one fresh subprocess per entry drives the runner; this module plans, watches and
turns what the runner saw into an artifact directory with a manifest.

The runner process does the compiling (a fresh XLA runtime each, so one entry's graphs never leak
into another's cache) and reports what it saw (aotc/runners/protocol.py); this process judges it against the
plan and never imports the stack.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aotc import __version__
from aotc.errors import BadInput
from aotc.fingerprint import Fingerprint, fingerprint_entry
from aotc.runners.spec import runner_python
from aotc.fingerprint import pin_kv
from aotc.manifest import CACHE_DIR_NAME, RUNTIME, FileRecord, GraphRecord, Manifest
from aotc.matrix import Entry, Matrix
from aotc.graphs import BuildPlan, GraphSpec
from aotc.plan import plan_entry
from aotc.runners.protocol import (PROGRESS_FD_ENV, BuildResult, Graph, Mode, Progress, Request, VerifyResult,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                               read_result)
from aotc.files import replace_dir, sha256_file
from aotc.reuse import Seed, published_artifact, seed_cache, settle, take_published
from aotc.store import Store

LOG_NAME = "build.log"


@dataclass(frozen=True)
class EntryBuild:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)entry: str
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)ok: bool
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)artifact_dir: str | None
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)planned: int
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)graphs_with_keys: int
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)runtime_graphs: int
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)files: int
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)size: int
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)wall_seconds: float
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)compile_seconds: float
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)error: str | None = None
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)log: str | None = None
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)problems: tuple[str, ...] = ()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)compiled: int | None = None
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""Cache files this build compiled; None where the runner's cache does not load (no reuse counted)."""
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)reused: int | None = None
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""Cache files found seeded from the store's compatible artifacts (aotc/reuse.py)."""
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)phases: dict[str, float] = field(default_factory=dict)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""Where the wall went (build_phases); empty for a failed build."""
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)source: str = "built"
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""``store`` for an entry taken whole from the store, already published as this build would make it."""

 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)def to_dict(self) -> dict[str, Any]:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    return self.__dict__ | {"problems": list(self.problems)}


@dataclass(frozen=True)
class BuildReport:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)entries: tuple[EntryBuild, ...] = field(default_factory=tuple)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)wall_seconds: float = 0.0

 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)@property
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)def ok(self) -> bool:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    return all(e.ok for e in self.entries)

 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)def to_dict(self) -> dict[str, Any]:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    return {"ok": self.ok, "wall_seconds": round(self.wall_seconds, 2),
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)            "entries": [e.to_dict() for e in self.entries]}


def parse_shard(shard: str | None) -> tuple[int, int]:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)if shard is None:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    return 0, 1
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)try:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    index, count = (int(x) for x in shard.split("/"))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)except ValueError:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    raise BadInput(f"--shard must be I/N with whole numbers, got {shard!r}") from None
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)if count < 1 or not 0 <= index < count:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    raise BadInput(f"--shard {shard}: need 0 <= I < N")
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)return index, count


def shard_entries(entries: list[Entry], shard: str | None) -> list[Entry]:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""A deterministic 1/N of the entries: by name order, so every shard of a job agrees."""
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)index, count = parse_shard(shard)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)return sorted(entries, key=lambda e: e.name)[index::count]


@dataclass(frozen=True)
class BuildOptions:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""How every entry of one ``aotc build`` is built."""

 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)traffic_requests: int = 32
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""Requests in the runner's sweep of real traffic (graphs only a running server reaches)."""
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)seed: int = 0
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""The sweep's random seed."""
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)precompile_workers: int | None = None
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""The backend's own parallel precompile (tpu-inference's NUM_PRECOMPILE_WORKERS); None: its default."""
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)store: Store | None = None
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""Reuse this store's compatible artifacts (and, where the stack's cache loads, their graphs)."""

 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)def check(self) -> None:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    if self.precompile_workers is not None and self.precompile_workers < 1:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)        raise BadInput(f"--precompile-workers must be at least 1, got {self.precompile_workers}")

 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)def runner_request(self) -> dict[str, Any]:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    """The runner protocol's fields for these options (aotc/runners/protocol.py: Request)."""
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    return {"traffic": self.traffic_requests, "seed": self.seed, "precompile_workers": self.precompile_workers}


def build_matrix(matrix: Matrix, entries: list[str] | None = None, out_dir: str | Path = "artifacts",
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)             jobs: int = 1, shard: str | None = None, options: BuildOptions = BuildOptions(),
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)             events: BuildEvents | None = None) -> BuildReport:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)if jobs < 1:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    raise BadInput(f"--jobs must be at least 1, got {jobs}")
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)options.check()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)selected = shard_entries(matrix.select(entries), shard)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)out = Path(out_dir)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)out.mkdir(parents=True, exist_ok=True)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)# the KV page count in every entry's engine arguments: the runner, the manifest's build.entry (verify
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)# plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)plans = [plan_entry(pin_kv(e, runner_process_env(e))) for e in selected]
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)start = time.perf_counter()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)events = events or BuildEvents()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)with ThreadPoolExecutor(max_workers=jobs) as pool:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    results = list(pool.map(lambda p: build_entry(p, out, options, events), plans))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)return BuildReport(tuple(results), time.perf_counter() - start)


def build_entry(plan: BuildPlan, out: Path, options: BuildOptions = BuildOptions(),
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)            events: BuildEvents | None = None) -> EntryBuild:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)entry, store = plan.entry, options.store
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)events = events or BuildEvents()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)final = out / entry.name
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)staging = out / f".{entry.name}.staging-{os.getpid()}"
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)shutil.rmtree(staging, ignore_errors=True)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)(staging / CACHE_DIR_NAME).mkdir(parents=True)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)start = time.perf_counter()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)fingerprint = fingerprint_entry(entry, runner_process_env(entry))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)if store is not None and (taken := take_from_store(plan, store, fingerprint.digest, staging, final, options,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                                                   start)):
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    events.finished(taken)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    return taken
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)events.started(entry.name, len(plan.graphs))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)planned_families = plan.families()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)loads = entry.backend.cache_loads
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)try:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    seeded = seed_cache(store, fingerprint.inputs, staging / CACHE_DIR_NAME) \
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)        if store is not None and loads else Seed()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    seeded_at = time.perf_counter()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    result = run_runner("build", plan, staging / CACHE_DIR_NAME, staging, **options.runner_request(),
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                        on_progress=lambda family, seconds: family in planned_families
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                        and events.family(entry.name, family, seconds))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    ran_at = time.perf_counter()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    graphs, problems = plan_coverage(plan, result)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    reuse = settle(seeded, staging / CACHE_DIR_NAME, result) if loads else None
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    recorded = {"precompile_workers": options.precompile_workers} if options.precompile_workers else {}
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    if reuse is not None:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)        recorded["reuse"] = reuse.to_dict()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    manifest = make_manifest(plan, fingerprint, staging, result, graphs, traffic=options.traffic_requests,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                             seed=options.seed, **recorded)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    manifest.save(staging)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    if problems or result.error:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)        report = _failed(entry, plan, start, result.error or problems[0], staging, problems)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    else:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)        replace_dir(str(staging), str(final))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)        done = time.perf_counter()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)        report = EntryBuild(
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)            entry=entry.name, ok=True, artifact_dir=str(final), planned=len(plan.graphs),
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)            graphs_with_keys=sum(1 for g in graphs if g.keys), runtime_graphs=len(result.runtime),
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)            files=len(manifest.files), size=manifest.total_size, wall_seconds=done - start,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)            compile_seconds=result.xla_compile_seconds, log=str(final / LOG_NAME),
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)            compiled=reuse.compiled if reuse else None, reused=reuse.reused if reuse else None,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)            phases=build_phases(seeded_at - start, ran_at - seeded_at, done - ran_at, result))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)except RunnerFailed as exc:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    report = _failed(entry, plan, start, str(exc), staging)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)events.finished(report)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)return report


def take_from_store(plan: BuildPlan, store: Store, fingerprint: str, staging: Path, final: Path,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                options: BuildOptions, start: float) -> EntryBuild | None:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""The entry as published, if the store holds it as this build would make it (aotc/reuse.py:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)published_artifact): no runner starts. None (staging left empty) where it must be built."""
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)manifest = published_artifact(store, plan, fingerprint, options.traffic_requests, options.seed)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)if manifest is None or not take_published(store, manifest, staging):
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    shutil.rmtree(staging / CACHE_DIR_NAME)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    (staging / CACHE_DIR_NAME).mkdir()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    return None
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)replace_dir(str(staging), str(final))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)wall = time.perf_counter() - start
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)return EntryBuild(
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    entry=plan.entry.name, ok=True, artifact_dir=str(final), planned=len(plan.graphs),
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    graphs_with_keys=len(plan.graphs), runtime_graphs=sum(1 for g in manifest.graphs if g.family == RUNTIME),
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    files=len(manifest.files), size=manifest.total_size, wall_seconds=wall, compile_seconds=0.0,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    compiled=0, reused=len(manifest.files), phases={"store": round(wall, 2)}, source="store")


def build_phases(seed: float, runner: float, finish: float, result: BuildResult) -> dict[str, float]:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""Wall seconds by phase: ``seed`` (planning the staging dir and seeding it from the store), the runner
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)process as ``runner_start`` (interpreter, the stack's imports, writing the result: what the runner's
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)own phases leave), ``engine`` (the stack's start-up and warm-up) and ``traffic`` (the sweep), then
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)``finish`` (counting reuse, hashing files, the manifest, the swap into place)."""
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)engine, traffic = result.engine_start_seconds or 0.0, result.traffic_seconds or 0.0
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)phases = {"seed": seed, "runner_start": runner - engine - traffic, "engine": engine, "traffic": traffic,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)          "finish": finish}
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)return {name: round(seconds, 2) for name, seconds in phases.items()}


def _failed(entry: Entry, plan: BuildPlan, start: float, error: str, staging: Path,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)        problems: list[str] | tuple[str, ...] = ()) -> EntryBuild:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)# the staging dir stays for a post-mortem: it holds the runner's log and whatever it compiled
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)return EntryBuild(entry=entry.name, ok=False, artifact_dir=None, planned=len(plan.graphs), graphs_with_keys=0,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                  runtime_graphs=0, files=0, size=0, wall_seconds=time.perf_counter() - start,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                  compile_seconds=0.0, error=error, log=str(staging / LOG_NAME), problems=tuple(problems))


def plan_coverage(plan: BuildPlan, result: BuildResult) -> tuple[list[GraphRecord], list[str]]:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""The one judge of plan coverage: the planned graphs (in plan order) with the keys of the warm-up calls
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)that match them, and the problems that fail the build — a planned graph the runner never compiled or
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)that left no cache entry, and a warm-up compile the plan does not list."""
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)calls: dict[str, list[Graph]] = {}
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)for call in result.calls:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    calls.setdefault(GraphSpec(call.family, tuple(call.shape.items())).key, []).append(call)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)graphs, problems = [], []
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)for spec in plan.graphs:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    matched = calls.get(spec.key, [])
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    keys = tuple(sorted({k for call in matched for k in call.keys}))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    graphs.append(GraphRecord(spec.family, spec.shape_dict, keys, sum(c.compile_seconds for c in matched),
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                              spec.beyond_warmup))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    if not matched:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)        problems.append(f"planned graph was never compiled by the runner: {spec.family}[{spec.label}]")
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    elif not keys:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)        problems.append(f"planned graph produced no cache entry: {spec.family}[{spec.label}]")
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)planned = {spec.key for spec in plan.graphs}
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)unplanned = [c for c in result.calls if c.keys and GraphSpec(c.family, tuple(c.shape.items())).key not in planned]
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)for extra in [*unplanned, *result.capture_outside]:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    problems.append(f"capture compiled a graph the plan does not list: {extra.family}"
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                    f"[{', '.join(f'{k}={v}' for k, v in extra.shape.items())}]")
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)return graphs, problems


class RunnerFailed(Exception):
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)pass


def runner_process_env(entry: Entry) -> dict[str, str]:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)env = dict(os.environ)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)env.update({k: str(v) for k, v in entry.env.items()})
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)return env


def run_runner(mode: Mode, plan: BuildPlan, cache_dir: Path, work_dir: Path,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)           on_progress: Callable[[str, float], None] | None = None, **options: Any) -> BuildResult | VerifyResult:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""Run the entry's runner in a fresh process (aotc/runners/protocol.py); its log goes to
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)``work_dir/build.log`` (or verify.log), its progress lines come back on a pipe."""
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)request = Request(entry=plan.entry.to_dict(), plan=[g.to_dict() for g in plan.graphs],
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                  cache_dir=str(cache_dir.resolve()), **options)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)request_path, result_path = work_dir / f"{mode}-request.json", work_dir / f"{mode}-result.json"
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)request_path.write_text(request.model_dump_json(indent=1))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)result_path.unlink(missing_ok=True)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)log_path = work_dir / f"{mode}.log"
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)spec = plan.entry.backend
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)read_fd, write_fd = os.pipe()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)try:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    with open(log_path, "w") as log:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)        proc = subprocess.Popen([runner_python(spec.name), "-m", spec.module, mode, str(request_path),
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                                 str(result_path)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                                env=runner_process_env(plan.entry) | {PROGRESS_FD_ENV: str(write_fd)}, pass_fds=(write_fd,))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)finally:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    os.close(write_fd)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)progress = _ProgressReader(read_fd, on_progress or (lambda family, seconds: None))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)proc.wait()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)progress.join()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)request_path.unlink(missing_ok=True)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)if not result_path.is_file():
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    raise RunnerFailed(f"{plan.entry.name}: the {mode} runner exited {proc.returncode} without a result "
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                       f"(last log lines: {_tail(log_path)})")
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)try:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    result = read_result(str(result_path), mode)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)except ValueError as exc:  # a result that breaks the protocol is the runner's bug, not a verdict
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    raise RunnerFailed(f"{plan.entry.name}: the {mode} runner wrote a malformed result: {exc}") from None
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)result_path.unlink()
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)if progress.bad_line:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    raise RunnerFailed(f"{plan.entry.name}: the {mode} runner wrote a malformed progress line: "
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                       f"{progress.bad_line[:200]!r}")
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)if proc.returncode and not result.error:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    result.error = f"the {mode} runner exited {proc.returncode}: {_tail(log_path)}"
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)return result


class _ProgressReader:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""Reads the runner's progress pipe on a thread as lines arrive (aotc/runners/protocol.py: Progress)."""

 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)def __init__(self, fd: int, on_progress: Callable[[str, float], None]):
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    self.bad_line: str | None = None
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    self._pipe = os.fdopen(fd, "r", encoding="utf-8", errors="replace")
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    self._on_progress = on_progress
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    self._thread = threading.Thread(target=self._read, daemon=True)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    self._thread.start()

 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)def _read(self) -> None:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    with self._pipe:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)        for line in self._pipe:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)            try:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                event = Progress.model_validate_json(line)
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)            except ValueError:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                self.bad_line = self.bad_line or line
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                continue
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)            self._on_progress(event.family, event.seconds)

 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)def join(self) -> None:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    # the runner has exited; only a process it forked could still hold the pipe open
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    self._thread.join(timeout=10)


def _tail(path: Path, lines: int = 3) -> str:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)try:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)except OSError:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    return ""


def file_records(cache_dir: Path) -> tuple[FileRecord, ...]:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)records = []
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)for path in sorted(p for p in cache_dir.rglob("*") if p.is_file() and not p.is_symlink()):
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    sha256, size = sha256_file(str(path))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    records.append(FileRecord(path=path.relative_to(cache_dir).as_posix(), sha256=sha256, size=size))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)return tuple(records)


def make_manifest(plan: BuildPlan, fp: Fingerprint, artifact_dir: Path, result: BuildResult,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)              planned: list[GraphRecord], **build_options: Any) -> Manifest:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)entry = plan.entry
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)graphs = (*(GraphRecord.from_dict(g.model_dump()) for g in result.startup), *planned,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)          *(GraphRecord.from_dict(g.model_dump()) for g in result.runtime))
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)return Manifest(
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    entry=entry.name, fingerprint=fp.digest, inputs=fp.inputs,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    created=datetime.now(timezone.utc).isoformat(timespec="seconds"), aotc_version=__version__,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    runner=entry.runner, device=entry.device, files=file_records(artifact_dir / CACHE_DIR_NAME), graphs=graphs,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    extra={"build": {"entry": entry.to_dict(), "planned": len(plan.graphs), **build_options,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                     "engine_start_seconds": result.engine_start_seconds,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                     "traffic_seconds": result.traffic_seconds,
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)                     "xla_compile_seconds": result.xla_compile_seconds}},
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py))


class BuildEvents:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)"""Callbacks as an entry starts, finishes each graph family and ends; the library only calls them (the
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)CLI passes one that prints, aotc/render.py: BuildProgressLines). The default says nothing."""

 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)def started(self, name: str, planned: int) -> None:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    pass

 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)def family(self, name: str, family: str, seconds: float) -> None:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    pass

 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)def finished(self, report: EntryBuild) -> None:
 plans from it) and the fingerprint all carry the one the stack sized (aotc/kv.py)    pass
