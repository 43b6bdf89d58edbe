"""``aotc build``: one fresh subprocess per entry drives the runner; this module plans, watches and
turns what the runner saw into an artifact directory with a manifest.

The runner process does the compiling (a fresh XLA runtime each, so one entry's graphs never leak
into another's cache); this process never imports torch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aotc import __version__
from aotc.errors import BadInput
from aotc.fingerprint import fingerprint_entry, runner_python
from aotc.manifest import CACHE_DIR_NAME, FileRecord, GraphRecord, Manifest
from aotc.matrix import Entry, Matrix
from aotc.plan import BuildPlan, plan_entry
from aotc.reuse import Seed, seed_cache, settle
from aotc.runners import PROGRESS_MARKER
from aotc.runners.spec import load_runner
from aotc.store import Store, sha256_file

RUNNER_MODULES = {"vllm-tpu": "aotc.runners.vllm_tpu", "tpu-inference": "aotc.runners.tpu_inference"}
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


def build_matrix(matrix: Matrix, entries: list[str] | None = None, out_dir: str | Path = "artifacts",
                 jobs: int = 1, shard: str | None = None, traffic: int = 32, seed: int = 0,
                 store: Store | None = None, precompile_workers: int | None = None) -> BuildReport:
    """``store``: reuse its compatible artifacts' graphs (runners whose cache loads); ``precompile_workers``:
    the backend's own parallel precompile (tpu-inference's NUM_PRECOMPILE_WORKERS)."""
    if jobs < 1:
        raise BadInput(f"--jobs must be at least 1, got {jobs}")
    if precompile_workers is not None and precompile_workers < 1:
        raise BadInput(f"--precompile-workers must be at least 1, got {precompile_workers}")
    selected = shard_entries(matrix.select(entries), shard)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plans = [plan_entry(e) for e in selected]
    start = time.perf_counter()
    reporter = _Reporter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda p: build_entry(p, out, traffic, seed, reporter, store=store,
                                                      precompile_workers=precompile_workers), plans))
    return BuildReport(tuple(results), time.perf_counter() - start)


def build_entry(plan: BuildPlan, out: Path, traffic: int, seed: int, reporter: _Reporter | None = None,
                store: Store | None = None, precompile_workers: int | None = None) -> EntryBuild:
    entry = plan.entry
    reporter = reporter or _Reporter()
    final = out / entry.name
    staging = out / f".{entry.name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / CACHE_DIR_NAME).mkdir(parents=True)
    start = time.perf_counter()
    reporter.started(entry.name, len(plan.graphs))
    planned_families = plan.families()
    loads = load_runner(entry.runner).cache_loads
    try:
        seeded = seed_cache(store, fingerprint_entry(entry, runner_env(entry)).inputs, staging / CACHE_DIR_NAME) \
            if store is not None and loads else Seed()
        result = run_runner("build", plan, staging / CACHE_DIR_NAME, staging, traffic=traffic, seed=seed,
                            precompile_workers=precompile_workers,
                            on_progress=lambda family, seconds: family in planned_families
                            and reporter.family(entry.name, family, seconds))
        problems = build_problems(plan, result)
        reuse = settle(seeded, staging / CACHE_DIR_NAME, result) if loads else None
        options = {"precompile_workers": precompile_workers} if precompile_workers else {}
        if reuse is not None:
            options["reuse"] = reuse.to_dict()
        manifest = make_manifest(plan, staging, result, traffic=traffic, seed=seed, **options)
        manifest.save(staging)
        if problems or result.get("error"):
            return _failed(entry, plan, start, result.get("error") or problems[0], staging, problems)
        _replace_dir(staging, final)
        report = EntryBuild(
            entry=entry.name, ok=True, artifact_dir=str(final), planned=len(plan.graphs),
            graphs_with_keys=sum(1 for g in result.get("graphs", []) if g.get("keys")),
            runtime_graphs=len(result.get("runtime", [])), files=len(manifest.files), size=manifest.total_size,
            wall_seconds=time.perf_counter() - start, compile_seconds=float(result.get("xla_compile_seconds", 0.0)),
            log=str(final / LOG_NAME), compiled=reuse.compiled if reuse else None,
            reused=reuse.reused if reuse else None)
    except RunnerFailed as exc:
        report = _failed(entry, plan, start, str(exc), staging)
    reporter.finished(report)
    return report


def _failed(entry: Entry, plan: BuildPlan, start: float, error: str, staging: Path,
            problems: list[str] | tuple[str, ...] = ()) -> EntryBuild:
    # the staging dir stays for a post-mortem: it holds the runner's log and whatever it compiled
    return EntryBuild(entry=entry.name, ok=False, artifact_dir=None, planned=len(plan.graphs), graphs_with_keys=0,
                      runtime_graphs=0, files=0, size=0, wall_seconds=time.perf_counter() - start,
                      compile_seconds=0.0, error=error, log=str(staging / LOG_NAME), problems=tuple(problems))


def build_problems(plan: BuildPlan, result: dict[str, Any]) -> list[str]:
    """A planned graph with no cache key, or a capture-time graph the plan does not list, fails the build."""
    problems = []
    got = {(g["family"], json.dumps(g["shape"], sort_keys=True)): g for g in result.get("graphs", [])}
    for spec in plan.graphs:
        record = got.get((spec.family, json.dumps(spec.shape_dict, sort_keys=True)))
        if record is None or not record.get("keys"):
            problems.append(f"planned graph produced no cache entry: {spec.family}[{spec.label}]")
    for extra in result.get("unplanned", []):
        problems.append(f"capture compiled a graph the plan does not list: {extra['family']}"
                        f"[{', '.join(f'{k}={v}' for k, v in extra.get('shape', {}).items())}]")
    return problems


class RunnerFailed(Exception):
    pass


def runner_env(entry: Entry) -> dict[str, str]:
    env = dict(os.environ)
    env.update({k: str(v) for k, v in entry.env.items()})
    return env


def follow_progress(proc: subprocess.Popen, log_path: Path, on_progress: Callable[[str, float], None]) -> None:
    """Wait for the runner, passing each family-done marker in its log to ``on_progress``."""
    with open(log_path, "rb") as log:
        pending = b""
        while True:
            finished = proc.poll() is not None
            pending += log.read()
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.startswith(PROGRESS_MARKER.encode()):
                    event = json.loads(line[len(PROGRESS_MARKER):])
                    on_progress(event["family"], event["seconds"])
            if finished:
                return
            time.sleep(0.5)


def run_runner(mode: str, plan: BuildPlan, cache_dir: Path, work_dir: Path,
               on_progress: Callable[[str, float], None] | None = None, **options: Any) -> dict[str, Any]:
    """Run the entry's runner in a fresh process; its log goes to ``work_dir/build.log`` (or verify.log)."""
    request = {"entry": plan.entry.to_dict(), "plan": [g.to_dict() for g in plan.graphs],
               "cache_dir": str(cache_dir.resolve()), **options}
    request_path, result_path = work_dir / f"{mode}-request.json", work_dir / f"{mode}-result.json"
    request_path.write_text(json.dumps(request, indent=1))
    result_path.unlink(missing_ok=True)
    log_path = work_dir / f"{mode}.log"
    module = RUNNER_MODULES[plan.entry.runner]
    with open(log_path, "w") as log:
        proc = subprocess.Popen([runner_python(plan.entry.runner), "-m", module, mode, str(request_path),
                                 str(result_path)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=runner_env(plan.entry))
        follow_progress(proc, log_path, on_progress or (lambda family, seconds: None))
    request_path.unlink(missing_ok=True)
    if not result_path.is_file():
        raise RunnerFailed(f"{plan.entry.name}: the {mode} runner exited {proc.returncode} without a result "
                           f"(last log lines: {_tail(log_path)})")
    result = json.loads(result_path.read_text())
    result_path.unlink()
    if proc.returncode and not result.get("error"):
        result["error"] = f"the {mode} runner exited {proc.returncode}: {_tail(log_path)}"
    return result


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


def make_manifest(plan: BuildPlan, artifact_dir: Path, result: dict[str, Any], **build_options: Any) -> Manifest:
    entry = plan.entry
    fp = fingerprint_entry(entry, runner_env(entry))
    recorded = [*result.get("startup", []), *result.get("graphs", []), *result.get("runtime", [])]
    graphs = tuple(GraphRecord.from_dict(g) for g in recorded)
    return Manifest(
        entry=entry.name, fingerprint=fp.digest, inputs=fp.inputs,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), aotc_version=__version__,
        runner=entry.runner, device=entry.device, files=file_records(artifact_dir / CACHE_DIR_NAME), graphs=graphs,
        extra={"build": {"entry": entry.to_dict(), "planned": len(plan.graphs), **build_options,
                         "engine_start_seconds": result.get("engine_start_seconds"),
                         "xla_compile_seconds": result.get("xla_compile_seconds")}},
    )


def _replace_dir(new: Path, final: Path) -> None:
    """Swap ``new`` into ``final``; an existing artifact is moved aside first and removed last."""
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        final.rename(old)
    new.rename(final)
    shutil.rmtree(old, ignore_errors=True)


class _Reporter:
    """Lines on stderr as an entry starts, finishes each graph family and ends (readable in CI logs too);
    the runner's own log goes to a file."""

    def started(self, name: str, planned: int) -> None:
        print(f"aotc build: {name}: compiling {planned} planned graphs + traffic sweep", file=sys.stderr, flush=True)

    def family(self, name: str, family: str, seconds: float) -> None:
        print(f"aotc build: {name}: {family} compiled in {seconds:.1f}s", file=sys.stderr, flush=True)

    def finished(self, report: EntryBuild) -> None:
        status = "ok" if report.ok else f"FAILED: {report.error}"
        if report.ok and report.compiled is not None:
            status += f", {report.compiled} compiled, {report.reused} reused from the store"
        print(f"aotc build: {report.entry}: {status} ({report.wall_seconds:.0f}s, {report.files} files, "
              f"log {report.log})", file=sys.stderr, flush=True)


def render_build(report: BuildReport, console) -> None:
    from rich.table import Table

    table = Table(title="aotc build", title_justify="left")
    for column in ("entry", "status", "planned", "with keys", "runtime", "files", "compiled", "reused", "MB",
                   "wall s", "XLA s"):
        table.add_column(column, justify="left" if column in ("entry", "status") else "right")
    for e in report.entries:
        table.add_row(e.entry, "ok" if e.ok else "[red]FAILED[/red]", str(e.planned), str(e.graphs_with_keys),
                      str(e.runtime_graphs), str(e.files), _count(e.compiled), _count(e.reused),
                      f"{e.size / 1e6:.1f}", f"{e.wall_seconds:.1f}",
                      f"{e.compile_seconds:.1f}")
    console.print(table)
    for e in report.entries:
        if e.ok:
            console.print(f"{e.entry}: artifact at {e.artifact_dir}")
        else:
            console.print(f"[red]{e.entry}: {e.error}[/red]")
            for problem in e.problems[1:]:
                console.print(f"  {problem}")
            console.print(f"  log: {e.log}")


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)
