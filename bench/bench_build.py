"""Build-cost benchmark: aotc's build against what a user would do instead, in the same run.

Baseline, per entry: start the stock vLLM of that entry (its runner's own engine arguments and environment,
nothing of aotc's instrumentation, no traffic) with VLLM_XLA_CACHE_PATH at an empty directory, let it finish
its warm-up, stop it, and copy the directory. aotc: `aotc build` of the entry (warm-up, the traffic sweep,
manifest), from scratch (no store reuse). Reported per entry and for the whole matrix (aim <= 1.3x), then
tpu-inference's parallel precompile (NUM_PRECOMPILE_WORKERS, `--precompile-workers`) on against off, and
with `--jobs-scaling` two vllm-tpu entries at `--jobs 2` against `--jobs 1`.
Figures from one run, side by side; nothing here is a pass/fail test.

    AOTC_PYTHON_TPU_INFERENCE=<jax venv>/bin/python python bench/bench_build.py   # make bench
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aotc.build import build_matrix
from aotc.fingerprint import runner_python
from aotc.matrix import Entry, load_matrix
from aotc.runners.spec import load_runner

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def children_cpu() -> float:
    """CPU seconds of finished child processes: steadier than wall on a shared machine."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def stock_seconds(entry: Entry, work: Path) -> tuple[float, int, float]:
    """(wall of start + warm-up + copy, files, child CPU seconds) for the stock engine of ``entry``."""
    cache, copy = work / "stock-cache", work / "stock-copy"
    cache.mkdir(parents=True)
    cpu = children_cpu()
    start = time.perf_counter()
    proc = subprocess.run([runner_python(entry.runner), __file__, "--stock", str(cache)], cwd=REPO, text=True,
                          input=json.dumps(entry.to_dict()), capture_output=True)
    if proc.returncode:
        raise SystemExit(f"stock vLLM failed for {entry.name}: {proc.stderr[-3000:]}")
    shutil.copytree(cache, copy)
    return time.perf_counter() - start, sum(1 for p in copy.rglob("*") if p.is_file()), children_cpu() - cpu


def stock_child(cache: str) -> None:
    """Under the runner's interpreter: the stock engine, as `vllm serve` would start it on this device."""
    entry = json.load(sys.stdin)
    engine = importlib.import_module(f"{load_runner(entry['runner']).module}.engine")
    engine.apply_env(engine.runtime_env(entry, cache))
    args = engine.engine_args(entry, 0) if entry["runner"] == "vllm-tpu" else engine.engine_args(entry)
    from vllm import LLM

    LLM(**args)
    sys.stdout.flush()
    os._exit(0)  # an in-process engine can hang in interpreter teardown


def aotc_build(config: Path, names: list[str] | None, traffic: int, workers: int | None = None, jobs: int = 1):
    with tempfile.TemporaryDirectory(prefix="aotc-bench-") as out:
        start = time.perf_counter()
        report = build_matrix(load_matrix(config), entries=names, out_dir=out, traffic=traffic,
                              precompile_workers=workers, jobs=jobs)
        wall = time.perf_counter() - start
    if not report.ok:
        raise SystemExit(f"build failed: {[e.error for e in report.entries if not e.ok]}")
    return wall, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, default=HERE / "jax-entries.yaml")
    parser.add_argument("--traffic", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="parallel precompile workers for the on figure")
    parser.add_argument("--jobs-scaling", action="store_true", help="also --jobs 2 vs --jobs 1 (bench/two-entries.yaml)")
    parser.add_argument("--stock", metavar="CACHE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stock:
        return stock_child(args.stock)

    entries = load_matrix(args.config).entries
    baseline = {}
    for entry in entries:
        with tempfile.TemporaryDirectory(prefix="aotc-bench-stock-") as work:
            baseline[entry.name] = stock_seconds(entry, Path(work))
    cpu = children_cpu()
    matrix_wall, report = aotc_build(args.config, None, args.traffic)
    matrix_cpu = children_cpu() - cpu
    rows = []
    for built in report.entries:
        stock, files, _ = baseline[built.entry]
        rows.append({"entry": built.entry, "aotc_s": round(built.wall_seconds, 1), "stock_s": round(stock, 1),
                     "ratio": round(built.wall_seconds / stock, 2), "aotc_files": built.files, "stock_files": files})
        print(f"{built.entry}: aotc build {built.wall_seconds:.1f}s ({built.files} files) vs stock start + copy "
              f"{stock:.1f}s ({files} files) = {built.wall_seconds / stock:.2f}x  (aim <= 1.3x)")
    stock_total, stock_cpu = sum(b[0] for b in baseline.values()), sum(b[2] for b in baseline.values())
    print(f"matrix of {len(entries)}: aotc build {matrix_wall:.1f}s vs stock {stock_total:.1f}s "
          f"= {matrix_wall / stock_total:.2f}x wall, CPU {matrix_cpu:.1f}s vs {stock_cpu:.1f}s "
          f"= {matrix_cpu / stock_cpu:.2f}x  (aim <= 1.3x)")

    first = entries[0].name
    off = next(e.wall_seconds for e in report.entries if e.entry == first)
    on_wall, on_report = aotc_build(args.config, [first], args.traffic, args.workers)
    on = on_report.entries[0]
    print(f"{first}: parallel precompile NUM_PRECOMPILE_WORKERS={args.workers} {on.wall_seconds:.1f}s "
          f"(XLA {on.compile_seconds:.1f}s) vs 1 {off:.1f}s = {off / on.wall_seconds:.2f}x speed-up")
    print(json.dumps({"entries": rows, "matrix": {"aotc_s": round(matrix_wall, 1), "stock_s": round(stock_total, 1),
                                                  "aotc_cpu_s": round(matrix_cpu, 1), "stock_cpu_s": round(stock_cpu, 1)},
                      "parallel_precompile": {"workers": args.workers, "on_s": round(on.wall_seconds, 1),
                                              "off_s": round(off, 1)}}))
    if args.jobs_scaling:
        one, _ = aotc_build(HERE / "two-entries.yaml", None, args.traffic)
        two, _ = aotc_build(HERE / "two-entries.yaml", None, args.traffic, jobs=2)
        print(f"two entries: --jobs 1 {one:.1f}s, --jobs 2 {two:.1f}s, speed-up = {one / two:.2f}x  (aim >= 1.7x)")


if __name__ == "__main__":
    main()
