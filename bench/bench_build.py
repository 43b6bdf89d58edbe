"""Build-cost benchmark: aotc's build against what a user would do instead, in the same run.

Baseline, per entry: start the stock vLLM of that entry (its runner's own engine arguments and environment,
nothing of aotc's instrumentation, no traffic) with VLLM_XLA_CACHE_PATH at an empty directory, let it finish
its warm-up, stop it, and copy the directory. aotc: `aotc build` of the entry (warm-up, the traffic sweep,
manifest), from scratch (no store reuse). Reported per entry and for the whole matrix (aim <= 1.3x), then
tpu-inference's parallel precompile (NUM_PRECOMPILE_WORKERS, `--precompile-workers`) on against off, and
with `--jobs-scaling` two vllm-tpu entries at `--jobs 2` against `--jobs 1`.
Incremental (the issue's must-show): the JAX demo is built and published to a fresh local store, one
value is added to a matrix axis (`--add`, default max_num_seqs=4), and the new entry is built by the same
`aotc build` command with the store (incremental) and with `--no-reuse` (from scratch), interleaved (ABBA),
`--rounds` each: process walls (median and best), the phases of each (EntryBuild.phases), compiled/reused,
verify of the incremental artifact, whether both hold the same cache files, and XLA seconds per graph
family. Then the whole grown matrix, rebuilt with the store (the published entry taken as it is, the new
one incremental) against built from scratch, interleaved, `--rounds` each. `--layers N` runs that on the
demo model made N layers deep (dummy weights): the tiny demo's build is mostly the stack's ~16 s of imports,
a real model's is mostly compiling, and depth moves the demo toward the latter.
Figures from one run, side by side; nothing here is a pass/fail test.

    AOTC_PYTHON_TPU_INFERENCE=<jax venv>/bin/python python bench/bench_build.py   # make bench
    ... bench/bench_build.py --incremental-only --rounds 3 [--layers 64] [--add max_num_batched_tokens=128]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from aotc.build import BuildOptions, build_matrix
from aotc.runners.spec import runner_python
from aotc.manifest import Manifest
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
        report = build_matrix(load_matrix(config), entries=names, out_dir=out, jobs=jobs,
                              options=BuildOptions(traffic_requests=traffic, precompile_workers=workers))
        wall = time.perf_counter() - start
    if not report.ok:
        raise SystemExit(f"build failed: {[e.error for e in report.entries if not e.ok]}")
    return wall, report


def cli(*args) -> tuple[float, dict]:
    """``aotc ARGS --json`` as a user runs it: (process wall, its JSON)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "aotc.cli", *map(str, args), "--json"], cwd=REPO, text=True,
                          capture_output=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"aotc {args[0]} failed: {proc.stderr[-3000:]}")
    return wall, json.loads(proc.stdout)


def deeper_model(source: str, layers: int, work: Path) -> str:
    """The demo model with ``layers`` decoder layers (still dummy weights): XLA compile time grows with depth,
    so the build's compile share approaches a real model's."""
    target = work / f"{Path(source).name}-{layers}-layers"
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return str(target)


def with_added(config: Path, axis: str, added: int, work: Path, layers: int | None = None) -> tuple[Path, str, str]:
    """The demo config with one value added to a matrix axis (model path made absolute; ``layers`` deepens
    the model): (config, old entry, new entry)."""
    matrix = load_matrix(config)
    data = yaml.safe_load(config.read_text())
    model = data["models"][0]
    model["model"] = matrix.entries[0].model_path or model["model"]
    if layers:
        model["model"] = deeper_model(model["model"], layers, work)
        model["name"] = f"{model['name']}-{layers}l"
    model["matrix"][axis] = [*model["matrix"][axis], added]
    out = work / "added.yaml"
    out.write_text(yaml.safe_dump(data))
    entries = load_matrix(out).entries
    return out, entries[0].name, next(e.name for e in entries if getattr(e, axis) == added)


def incremental(config: Path, axis: str, added: int, rounds: int, traffic: int, layers: int | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="aotc-bench-inc-") as tmp:
        work = Path(tmp)
        grown, old, new = with_added(config, axis, added, work, layers)
        store = work / "store"
        _, base = cli("build", grown, "--entry", old, "--out", work / "base", "--no-reuse", "--traffic", traffic)
        cli("publish", base["entries"][0]["artifact_dir"], "--store", store)
        def entry_build(reuse: list, out: Path) -> tuple[float, dict]:
            wall, report = cli("build", grown, "--entry", new, "--out", out, "--traffic", traffic, *reuse)
            built = report["entries"][0]
            return wall, {**built, "xla_by_family": xla_seconds_by_family(built["artifact_dir"])}

        runs = with_and_without_store(("incremental", "scratch"), store, work, rounds, entry_build)
        inc_dir, scratch_dir = (Path(runs[k][-1][1]["artifact_dir"]) / "cache" for k in ("incremental", "scratch"))
        same_files = sorted(os.listdir(inc_dir)) == sorted(os.listdir(scratch_dir))
        _, verified = cli("verify", inc_dir.parent)
        matrix = rebuild_matrix(grown, store, work, rounds, traffic)
    return {"entry": new, "rounds": rounds, "runs": runs, "same_files": same_files,
            "verify_misses": verified["misses"], "loadable": verified["loadable"], "matrix": matrix}


def rebuild_matrix(grown: Path, store: Path, work: Path, rounds: int, traffic: int) -> dict[str, list]:
    """The whole grown matrix rebuilt with the store (the published entry taken as it is, the new one built
    incrementally) against built from scratch, interleaved: [(wall, {entry: source})] per kind."""
    def matrix_build(reuse: list, out: Path) -> tuple[float, dict]:
        wall, report = cli("build", grown, "--out", out, "--traffic", traffic, *reuse)
        return wall, {e["entry"]: e["source"] for e in report["entries"]}

    return with_and_without_store(("rebuild", "scratch"), store, work / "matrix", rounds, matrix_build)


def with_and_without_store(kinds: tuple[str, str], store: Path, work: Path, rounds: int,
                           build: Callable[[list, Path], tuple[float, dict]]) -> dict[str, list]:
    """``build(reuse args, out dir)`` with the store (the first kind) and with `--no-reuse` (the second),
    interleaved ABBA over ``rounds``: {kind: [(wall, record)]}."""
    runs: dict[str, list] = {kind: [] for kind in kinds}
    for i in range(rounds):
        for kind in (kinds if i % 2 == 0 else kinds[::-1]):
            reuse = ["--store", store] if kind == kinds[0] else ["--no-reuse"]
            runs[kind].append(build(reuse, work / f"{kind}-{i}"))
    return runs


def xla_seconds_by_family(artifact_dir: str) -> dict[str, float]:
    """XLA seconds per graph family from a build's manifest (a cache hit's deserialization counts: JAX times
    it as a backend compile)."""
    by_family: dict[str, float] = {}
    for graph in Manifest.load(artifact_dir).graphs:
        by_family[graph.family] = by_family.get(graph.family, 0.0) + graph.compile_seconds
    return {family: round(seconds, 1) for family, seconds in sorted(by_family.items(), key=lambda kv: -kv[1])}


def print_incremental(result: dict) -> dict:
    summary = {}
    for kind, runs in result["runs"].items():
        walls = [wall for wall, _ in runs]
        phases = {name: round(statistics.median(e["phases"][name] for _, e in runs), 2) for name in runs[0][1]["phases"]}
        last = runs[-1][1]
        summary[kind] = {"median_s": round(statistics.median(walls), 1), "best_s": round(min(walls), 1),
                         "walls": [round(w, 1) for w in walls], "phases_median_s": phases,
                         "xla_compile_s": round(statistics.median(e["compile_seconds"] for _, e in runs), 1),
                         "compiled": last["compiled"], "reused": last["reused"]}
        print(f"{result['entry']} {kind}: wall median {summary[kind]['median_s']}s best {summary[kind]['best_s']}s "
              f"(runs {summary[kind]['walls']}), {last['compiled']} compiled, {last['reused']} reused, XLA compile "
              f"{summary[kind]['xla_compile_s']}s, phases (median s) {phases}; XLA s by family (last run) "
              f"{last['xla_by_family']}")
    inc, scratch = summary["incremental"], summary["scratch"]
    summary["ratio_median"] = round(inc["median_s"] / scratch["median_s"], 2)
    summary["ratio_best"] = round(inc["best_s"] / scratch["best_s"], 2)
    print(f"incremental vs from scratch (--no-reuse), same command, {result['rounds']} interleaved rounds each: "
          f"median {summary['ratio_median']}x, best {summary['ratio_best']}x  (aim <= 0.5x); incremental verify "
          f"{result['verify_misses']} misses, loadable {result['loadable']}; same cache files as from scratch: "
          f"{result['same_files']}")
    walls = {kind: [wall for wall, _ in runs] for kind, runs in result["matrix"].items()}
    medians = {kind: round(statistics.median(w), 1) for kind, w in walls.items()}
    sources = result["matrix"]["rebuild"][-1][1]
    summary["matrix"] = {"sources": sources, "walls": walls, "median_s": medians,
                         "ratio_median": round(medians["rebuild"] / medians["scratch"], 2)}
    print(f"the grown matrix ({len(sources)} entries) rebuilt with the store {sources} vs built from scratch: median "
          f"{medians['rebuild']}s vs {medians['scratch']}s = {summary['matrix']['ratio_median']}x  (aim <= 0.5x)")
    return summary


def axis_value(text: str) -> tuple[str, int]:
    axis, _, value = text.partition("=")
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected AXIS=INTEGER, got {text!r}")
    return axis, int(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, default=HERE / "jax-entries.yaml")
    parser.add_argument("--traffic", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="parallel precompile workers for the on figure")
    parser.add_argument("--jobs-scaling", action="store_true", help="also --jobs 2 vs --jobs 1 (bench/two-entries.yaml)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the incremental figure")
    parser.add_argument("--add", default="max_num_seqs=4", metavar="AXIS=VALUE", type=axis_value,
                        help="the matrix value the incremental figure adds (e.g. max_num_batched_tokens=128)")
    parser.add_argument("--incremental-only", action="store_true", help="only the incremental vs from-scratch figure")
    parser.add_argument("--layers", type=int, help="incremental figure on the demo model made this deep (e.g. 64)")
    parser.add_argument("--stock", metavar="CACHE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    axis, added = args.add
    if args.stock:
        return stock_child(args.stock)
    demo = REPO / "configs" / "demo-jax.yaml"
    if args.incremental_only:
        print(json.dumps({"incremental": print_incremental(incremental(demo, axis, added, args.rounds,
                                                                        args.traffic, args.layers))}))
        return

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
    print(json.dumps({"incremental": print_incremental(incremental(demo, axis, added, args.rounds, args.traffic))}))
    if args.jobs_scaling:
        one, _ = aotc_build(HERE / "two-entries.yaml", None, args.traffic)
        two, _ = aotc_build(HERE / "two-entries.yaml", None, args.traffic, jobs=2)
        print(f"two entries: --jobs 1 {one:.1f}s, --jobs 2 {two:.1f}s, speed-up = {one / two:.2f}x  (aim >= 1.7x)")


if __name__ == "__main__":
    main()
