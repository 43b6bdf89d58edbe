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
from aotc.fingerprint import Fingerprint, fingerprint_entry, pin_kv, require_pinned
from aotc.runners.spec import runner_python
from aotc.runners.tpu_host import compiles_without_running
from aotc.manifest import CACHE_DIR_NAME, RUNTIME, FileRecord, GraphRecord, Manifest
from aotc.matrix import Entry, Matrix
from aotc.graphs import BuildPlan, GraphSpec
from aotc.hf_cache import download_hint, hub_cache_dir
from aotc.plan import plan_entry
from aotc.runners.protocol import (PROGRESS_FD_ENV, BuildResult, Graph, Mode, Progress, Request, VerifyResult,
                                   read_result)
from aotc.files import check_replaceable_dir, replace_dir, sha256_file
from aotc.reuse import SeededCache, published_artifact, seed_cache, settle, take_published
from aotc.store import Store

LOG_NAME = "build.log"


@dataclass(frozen=True)
class EntryBuild:
    entry: str
    ok: bool
    artifact_dir: str | None
    planned: int
    graphs_with_keys: int
    runtime_graphs: int
    files: int
    size: int
    wall_seconds: float
    compile_seconds: float
    error: str | None = None
    log: str | None = None
    problems: tuple[str, ...] = ()
    compiled: int | None = None
    """Cache files this build compiled; None where the runner's cache does not load (no reuse counted)."""
    reused: int | None = None
    """Cache files found seeded from the store's compatible artifacts (aotc/reuse.py)."""
    phases: dict[str, float] = field(default_factory=dict)
    """Where the wall went (build_phases); empty for a failed build."""
    source: str = "built"
    """``store`` for an entry taken whole from the store, already published as this build would make it."""

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__ | {"problems": list(self.problems)}


@dataclass(frozen=True)
class BuildReport:
    entries: tuple[EntryBuild, ...] = field(default_factory=tuple)
    wall_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(e.ok for e in self.entries)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "wall_seconds": round(self.wall_seconds, 2),
                "entries": [e.to_dict() for e in self.entries]}


def parse_shard(shard: str | None) -> tuple[int, int]:
    if shard is None:
        return 0, 1
    try:
        index, count = (int(x) for x in shard.split("/"))
    except ValueError:
        raise BadInput(f"--shard must be I/N with whole numbers, got {shard!r}") from None
    if count < 1 or not 0 <= index < count:
        raise BadInput(f"--shard {shard}: need 0 <= I < N")
    return index, count


def shard_entries(entries: list[Entry], shard: str | None) -> list[Entry]:
    """A deterministic 1/N of the entries: by name order, so every shard of a job agrees."""
    index, count = parse_shard(shard)
    return sorted(entries, key=lambda e: e.name)[index::count]


@dataclass(frozen=True)
class BuildOptions:
    """How every entry of one ``aotc build`` is built."""

    traffic_requests: int = 32
    """Requests in the runner's sweep of real traffic (graphs only a running server reaches)."""
    seed: int = 0
    """The sweep's random seed."""
    precompile_workers: int | None = None
    """The backend's own parallel precompile (tpu-inference's NUM_PRECOMPILE_WORKERS); None: its default."""
    store: Store | None = None
    """Reuse this store's compatible artifacts (and, where the stack's cache loads, their graphs)."""

    def check(self) -> None:
        if self.precompile_workers is not None and self.precompile_workers < 1:
            raise BadInput(f"--precompile-workers must be at least 1, got {self.precompile_workers}")

    def runner_request(self) -> dict[str, Any]:
        """The runner protocol's fields for these options (aotc/runners/protocol.py: Request)."""
        return {"traffic": self.traffic_requests, "seed": self.seed, "precompile_workers": self.precompile_workers}


def build_matrix(matrix: Matrix, entries: list[str] | None = None, out_dir: str | Path = "artifacts",
                 jobs: int = 1, shard: str | None = None, options: BuildOptions = BuildOptions(),
                 events: BuildEvents | None = None) -> BuildReport:
    if jobs < 1:
        raise BadInput(f"--jobs must be at least 1, got {jobs}")
    options.check()
    selected = shard_entries(matrix.select(entries), shard)
    require_pinned(selected)  # before any download: what a pod would load must be known
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for entry in selected:  # before hours of compiling, not at the final rename
        check_replaceable_dir(out / entry.name)
    for entry in {(e.model, e.revision): e for e in selected}.values():
        fetch_model_config(entry)
    # the KV block count in every entry's engine arguments: the runner, the manifest's build.entry (verify
    # plans from it) and the fingerprint all carry the one the stack sized (fingerprint.entry_kv_blocks)
    plans = [plan_entry(pin_kv(e, runner_process_env(e))) for e in selected]
    start = time.perf_counter()
    events = events or BuildEvents()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda p: build_entry(p, out, options, events), plans))
    return BuildReport(tuple(results), time.perf_counter() - start)


_FETCH_CONFIG = ("import sys; from huggingface_hub import hf_hub_download; "
                 "hf_hub_download(*sys.argv[1:3], revision=sys.argv[3])")


def fetch_model_config(entry: Entry) -> None:
    """A hub model's config.json in the Hugging Face cache before the plan reads it (a MoE, vision or drafting
    model plans from it), fetched as vLLM fetches the rest a moment later: by the runner's huggingface_hub, so
    HF_TOKEN, HF_ENDPOINT and HF_HUB_OFFLINE apply."""
    if entry.readable_config_path is not None or not entry.backend.loads_models:
        return
    proc = subprocess.run([runner_python(entry.runner), "-c", _FETCH_CONFIG, entry.model, "config.json",
                           entry.revision], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 or entry.readable_config_path is None:
        cause = next((line for line in reversed(proc.stderr.splitlines()) if line.strip()), "not in the cache after")
        raise BadInput(f"{entry.name}: config.json of {entry.model}@{entry.revision} is neither in the Hugging Face "
                       f"cache ({hub_cache_dir()}) nor downloadable: {cause.strip()[:300]}; "
                       f"`{download_hint(entry.model, entry.revision)}` on a machine with access fetches it")


def build_entry(plan: BuildPlan, out: Path, options: BuildOptions = BuildOptions(),
                events: BuildEvents | None = None) -> EntryBuild:
    entry, store = plan.entry, options.store
    events = events or BuildEvents()
    final = out / entry.name
    staging = out / f".{entry.name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / CACHE_DIR_NAME).mkdir(parents=True)
    start = time.perf_counter()
    fingerprint = fingerprint_entry(entry, runner_process_env(entry))
    if store is not None and (taken := take_from_store(plan, store, fingerprint.digest, staging, final, options,
                                                       start)):
        events.finished(taken)
        return taken
    events.started(entry.name, len(plan.graphs), sweep=not compiles_without_running(entry.device))
    planned_families = plan.families()
    loads = entry.backend.cache_loads
    try:
        seeded = seed_cache(store, fingerprint.inputs, staging / CACHE_DIR_NAME) \
            if store is not None and loads else SeededCache()
        seeded_at = time.perf_counter()
        result = run_runner("build", plan, staging / CACHE_DIR_NAME, staging, **options.runner_request(),
                            on_progress=lambda family, seconds: family in planned_families
                            and events.family(entry.name, family, seconds))
        ran_at = time.perf_counter()
        graphs, problems = plan_coverage(plan, result)
        reuse = settle(seeded, staging / CACHE_DIR_NAME, result) if loads else None
        recorded = {"precompile_workers": options.precompile_workers} if options.precompile_workers else {}
        if reuse is not None:
            recorded["reuse"] = reuse.to_dict()
        manifest = make_manifest(plan, fingerprint, staging, result, graphs, traffic=options.traffic_requests,
                                 seed=options.seed, **recorded)
        manifest.save(staging)
        if problems or result.error:
            report = _failed(entry, plan, start, result.error or problems[0], staging, problems)
        else:
            replace_dir(str(staging), str(final))
            done = time.perf_counter()
            report = EntryBuild(
                entry=entry.name, ok=True, artifact_dir=str(final), planned=len(plan.graphs),
                graphs_with_keys=sum(1 for g in graphs if g.keys), runtime_graphs=len(result.runtime),
                files=len(manifest.files), size=manifest.total_size, wall_seconds=done - start,
                compile_seconds=result.xla_compile_seconds, log=str(final / LOG_NAME),
                compiled=reuse.compiled if reuse else None, reused=reuse.reused if reuse else None,
                phases=build_phases(seeded_at - start, ran_at - seeded_at, done - ran_at, result))
    except RunnerFailed as exc:
        report = _failed(entry, plan, start, str(exc), staging)
    events.finished(report)
    return report


def take_from_store(plan: BuildPlan, store: Store, fingerprint: str, staging: Path, final: Path,
                    options: BuildOptions, start: float) -> EntryBuild | None:
    """The entry as published, if the store holds it as this build would make it (aotc/reuse.py:
    published_artifact): no runner starts. None (staging left empty) where it must be built."""
    manifest = published_artifact(store, plan, fingerprint, options.traffic_requests, options.seed)
    if manifest is None or not take_published(store, manifest, staging):
        shutil.rmtree(staging / CACHE_DIR_NAME)
        (staging / CACHE_DIR_NAME).mkdir()
        return None
    replace_dir(str(staging), str(final))
    wall = time.perf_counter() - start
    return EntryBuild(
        entry=plan.entry.name, ok=True, artifact_dir=str(final), planned=len(plan.graphs),
        graphs_with_keys=len(plan.graphs), runtime_graphs=sum(1 for g in manifest.graphs if g.family == RUNTIME),
        files=len(manifest.files), size=manifest.total_size, wall_seconds=wall, compile_seconds=0.0,
        compiled=0, reused=len(manifest.files), phases={"store": round(wall, 2)}, source="store")


def build_phases(seeding: float, runner: float, finish: float, result: BuildResult) -> dict[str, float]:
    """Wall seconds by phase: ``seed`` (planning the staging dir and seeding it from the store), the runner
    process as ``runner_start`` (interpreter, the stack's imports, writing the result: what the runner's
    own phases leave), ``engine`` (the stack's start-up and warm-up) and ``traffic`` (the sweep), then
    ``finish`` (counting reuse, hashing files, the manifest, the swap into place)."""
    engine, traffic = result.engine_start_seconds or 0.0, result.traffic_seconds or 0.0
    phases = {"seed": seeding, "runner_start": runner - engine - traffic, "engine": engine, "traffic": traffic,
              "finish": finish}
    return {name: round(seconds, 2) for name, seconds in phases.items()}


def _failed(entry: Entry, plan: BuildPlan, start: float, error: str, staging: Path,
            problems: list[str] | tuple[str, ...] = ()) -> EntryBuild:
    # the staging dir stays for a post-mortem: it holds the runner's log and whatever it compiled
    return EntryBuild(entry=entry.name, ok=False, artifact_dir=None, planned=len(plan.graphs), graphs_with_keys=0,
                      runtime_graphs=0, files=0, size=0, wall_seconds=time.perf_counter() - start,
                      compile_seconds=0.0, error=error, log=str(staging / LOG_NAME), problems=tuple(problems))


def plan_coverage(plan: BuildPlan, result: BuildResult) -> tuple[list[GraphRecord], list[str]]:
    """The one judge of plan coverage: the planned graphs (in plan order) with the keys of the warm-up calls
    that match them, and the problems that fail the build — a planned graph the runner never compiled or
    that left no cache entry, and a warm-up compile the plan does not list."""
    calls: dict[str, list[Graph]] = {}
    for call in result.calls:
        calls.setdefault(GraphSpec(call.family, tuple(call.shape.items())).key, []).append(call)
    graphs, problems = [], []
    for spec in plan.graphs:
        matched = calls.get(spec.key, [])
        keys = tuple(sorted({k for call in matched for k in call.keys}))
        compiled = max((c.compiled for c in matched), key=lambda f: f.get("peak_memory_bytes", 0), default={})
        graphs.append(GraphRecord(spec.family, spec.shape_dict, keys, sum(c.compile_seconds for c in matched),
                                  spec.beyond_warmup, compiled))
        if not matched:
            problems.append(f"planned graph was never compiled by the runner: {spec.family}[{spec.label}]")
        elif not keys:
            problems.append(f"planned graph produced no cache entry: {spec.family}[{spec.label}]")
    planned = {spec.key for spec in plan.graphs}
    unplanned = [c for c in result.calls if c.keys and GraphSpec(c.family, tuple(c.shape.items())).key not in planned]
    for extra in [*unplanned, *result.capture_outside]:
        problems.append(f"capture compiled a graph the plan does not list: {extra.family}"
                        f"[{', '.join(f'{k}={v}' for k, v in extra.shape.items())}]")
    return graphs, problems


class RunnerFailed(Exception):
    pass


def runner_process_env(entry: Entry) -> dict[str, str]:
    env = dict(os.environ)
    env.update({k: str(v) for k, v in entry.env.items()})
    return env


def run_runner(mode: Mode, plan: BuildPlan, cache_dir: Path, work_dir: Path,
               on_progress: Callable[[str, float], None] | None = None, **options: Any) -> BuildResult | VerifyResult:
    """Run the entry's runner in a fresh process (aotc/runners/protocol.py); its log goes to
    ``work_dir/build.log`` (or verify.log), its progress lines come back on a pipe."""
    request = Request(entry=plan.entry, plan=[g.to_dict() for g in plan.graphs],
                      cache_dir=str(cache_dir.resolve()), **options)
    request_path, result_path = work_dir / f"{mode}-request.json", work_dir / f"{mode}-result.json"
    request_path.write_text(request.model_dump_json(indent=1))
    result_path.unlink(missing_ok=True)
    log_path = work_dir / f"{mode}.log"
    spec = plan.entry.backend
    read_fd, write_fd = os.pipe()
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen([runner_python(spec.name), "-m", spec.module, mode, str(request_path),
                                     str(result_path)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=runner_process_env(plan.entry) | {PROGRESS_FD_ENV: str(write_fd)}, pass_fds=(write_fd,))
    finally:
        os.close(write_fd)
    progress = _ProgressReader(read_fd, on_progress or (lambda family, seconds: None))
    proc.wait()
    progress.join()
    request_path.unlink(missing_ok=True)
    if not result_path.is_file():
        raise RunnerFailed(f"{plan.entry.name}: the {mode} runner exited {proc.returncode} without a result "
                           f"(last log lines: {_tail(log_path)})")
    try:
        result = read_result(str(result_path), mode)
    except ValueError as exc:  # a result that breaks the protocol is the runner's bug, not a verdict
        raise RunnerFailed(f"{plan.entry.name}: the {mode} runner wrote a malformed result: {exc}") from None
    result_path.unlink()
    if progress.bad_line:
        raise RunnerFailed(f"{plan.entry.name}: the {mode} runner wrote a malformed progress line: "
                           f"{progress.bad_line[:200]!r}")
    if proc.returncode and not result.error:
        result.error = f"the {mode} runner exited {proc.returncode}: {_tail(log_path)}"
    return result


class _ProgressReader:
    """Reads the runner's progress pipe on a thread as lines arrive (aotc/runners/protocol.py: Progress)."""

    def __init__(self, fd: int, on_progress: Callable[[str, float], None]):
        self.bad_line: str | None = None
        self._pipe = os.fdopen(fd, "r", encoding="utf-8", errors="replace")
        self._on_progress = on_progress
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with self._pipe:
            for line in self._pipe:
                try:
                    event = Progress.model_validate_json(line)
                except ValueError:
                    self.bad_line = self.bad_line or line
                    continue
                self._on_progress(event.family, event.seconds)

    def join(self) -> None:
        # the runner has exited; only a process it forked could still hold the pipe open
        self._thread.join(timeout=10)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def file_records(cache_dir: Path) -> tuple[FileRecord, ...]:
    records = []
    for path in sorted(p for p in cache_dir.rglob("*") if p.is_file() and not p.is_symlink()):
        sha256, size = sha256_file(str(path))
        records.append(FileRecord(path=path.relative_to(cache_dir).as_posix(), sha256=sha256, size=size))
    return tuple(records)


def make_manifest(plan: BuildPlan, fp: Fingerprint, artifact_dir: Path, result: BuildResult,
                  planned: list[GraphRecord], **build_options: Any) -> Manifest:
    entry = plan.entry
    graphs = (*(GraphRecord.from_dict(g.model_dump()) for g in result.startup), *planned,
              *(GraphRecord.from_dict(g.model_dump()) for g in result.runtime))
    return Manifest(
        entry=entry.name, fingerprint=fp.digest, inputs=fp.inputs,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), aotc_version=__version__,
        runner=entry.runner, device=entry.device, files=file_records(artifact_dir / CACHE_DIR_NAME), graphs=graphs,
        extra={"build": {"entry": entry.to_dict(), "planned": len(plan.graphs), **build_options,
                         "engine_start_seconds": result.engine_start_seconds,
                         "traffic_seconds": result.traffic_seconds,
                         "xla_compile_seconds": result.xla_compile_seconds},
               **({"target": result.target} if result.target else {})},
    )


class BuildEvents:
    """Callbacks as an entry starts, finishes each graph family and ends; the library only calls them (the
    CLI passes one that prints, aotc/render.py: BuildProgressLines). The default says nothing."""

    def started(self, name: str, planned: int, sweep: bool = True) -> None:
        pass

    def family(self, name: str, family: str, seconds: float) -> None:
        pass

    def finished(self, report: EntryBuild) -> None:
        pass
