"""TPU target vs CPU twin, same entry, side by side: what building TPU executables on a host without a TPU costs.

For each pair of configs (the same model and shapes, `device: tpu` against `device: cpu`), `aotc build` runs
as a user runs it, from scratch (a fresh AOTC_HOME: KV sizing included, nothing reused), alternating ABAB over
`--rounds`. Reported per build: process wall, planned graphs, graphs per minute, peak RSS of the largest process
(the runner: `ru_maxrss` of the waited-for children), XLA compile seconds per graph family; then the ratio
TPU / twin of the walls. `--real CONFIG` adds a TPU-only build of each real-size entry of CONFIG, one build per
entry (its config only, abstract weights), e.g. configs/real-size-jax-tpu.yaml (Qwen3-8B on a v6e-1, gpt-oss-20b on
a v6e-4; make bench passes it). Figures from one run;
nothing here is a pass/fail test.

    AOTC_PYTHON_TPU_INFERENCE=<jax venv>/bin/python python bench/bench_tpu_target.py [--rounds 2] [--real CONFIG]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from aotc.matrix import load_matrix

REPO = Path(__file__).resolve().parents[1]
PAIRS = [(REPO / "configs" / "demo-jax-tpu.yaml", REPO / "configs" / "demo-jax.yaml")]


def build(config: Path, traffic: int, entry: str | None = None) -> dict:
    """One `aotc build --json` of one entry (the config's only one when None) in a fresh process and home: wall,
    the largest process's peak RSS, the manifest."""
    with tempfile.TemporaryDirectory(prefix="aotc-bench-tpu-") as tmp:
        env = {**os.environ, "AOTC_HOME": str(Path(tmp) / "home")}
        # the fresh home still needs the venvs: keep where the runner's interpreter is
        script = ("import resource, subprocess, sys, time, json; t = time.perf_counter(); "
                  "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
                  "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
                  "print(json.dumps({'rc': p.returncode, 'wall': time.perf_counter() - t, "
                  "'peak_rss_mb': u.ru_maxrss / 1024, 'out': p.stdout, 'err': p.stderr[-3000:]}))")
        proc = subprocess.run([sys.executable, "-c", script, sys.executable, "-m", "aotc.cli", "build", str(config),
                               "--out", str(Path(tmp) / "out"), "--no-reuse", "--traffic", str(traffic), "--json",
                               *(["--entry", entry] if entry else [])],
                              capture_output=True, text=True, cwd=REPO, env=env)
        run = json.loads(proc.stdout)
        if run["rc"]:
            raise SystemExit(f"build of {config} failed: {run['err']}")
        [entry] = json.loads(run["out"])["entries"]
        manifest = json.loads((Path(entry["artifact_dir"]) / "manifest.json").read_text())
    families: dict[str, float] = {}
    for graph in manifest["graphs"]:
        families[graph["family"]] = round(families.get(graph["family"], 0.0) + graph["compile_seconds"], 2)
    return {"config": config.name, "wall": round(run["wall"], 1), "peak_rss_mb": round(run["peak_rss_mb"]),
            "planned": entry["planned"], "files": entry["files"],
            "graphs_per_minute": round(60 * entry["planned"] / run["wall"], 1),
            "target": (manifest.get("target") or {}).get("topology", manifest["device"]), "families": families}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--traffic", type=int, default=32, help="the twin's sweep (a TPU target serves none)")
    parser.add_argument("--real", type=Path, action="append", default=[], help="a real-size TPU entry's config")
    args = parser.parse_args()
    results = []
    for tpu, twin in PAIRS:
        runs: dict[str, list[dict]] = {"tpu": [], "twin": []}
        for _ in range(args.rounds):  # ABAB: a drift in the machine's load falls on both
            runs["tpu"].append(build(tpu, args.traffic))
            runs["twin"].append(build(twin, args.traffic))
        walls = {side: statistics.median(r["wall"] for r in rs) for side, rs in runs.items()}
        results.append({"pair": [tpu.name, twin.name], "runs": runs, "median_wall": walls,
                        "tpu_over_twin": round(walls["tpu"] / walls["twin"], 2)})
    for config in args.real:
        # one build per entry: each its own wall and peak RSS, as a user building that entry sees them
        for entry in load_matrix(config, check_stack=False).entries:
            results.append({"real": str(config), "entry": entry.name, "run": build(config, 0, entry.name)})
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
