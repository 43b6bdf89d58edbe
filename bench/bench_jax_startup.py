"""Start-up benchmark for the JAX backend: a pod's vLLM-TPU (the CPU twin) with the fetched cache vs cold.

Builds, verifies and publishes configs/demo-jax.yaml to a temporary store, fetches it the way a pod's init
container does, then starts the engine twice in fresh processes under the JAX venv: on an empty cache
dir (cold) and on the fetched one (warm). Prints engine start-up seconds, their ratio, and how many
graphs XLA compiled during start-up in each case (from JAX's own monitoring events).
Figures from one run each (`--repeat N` for more); nothing here is a pass/fail test.

    AOTC_PYTHON_TPU_INFERENCE=<jax venv>/bin/python python bench/bench_jax_startup.py   # make bench-jax
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "configs" / "demo-jax.yaml"
ENTRY = "tiny-llama-jax--len128-seqs8-tok64-tp1"


def aotc(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "aotc.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"aotc {args[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def fetched_cache(work: Path) -> Path:
    """What a pod's init container leaves at VLLM_XLA_CACHE_PATH."""
    aotc("build", DEMO, "--out", work / "artifacts", "--traffic", "16")
    aotc("verify", work / "artifacts" / ENTRY, "--traffic", "16")
    aotc("publish", work / "artifacts" / ENTRY, "--store", work / "store")
    aotc("fetch", "--config", DEMO, "--entry", ENTRY, "--dest", work / "pod" / "cache", "--store", work / "store")
    return work / "pod" / "cache"


def start_once(python: str, entry: dict, cache: Path) -> dict:
    proc = subprocess.run([python, __file__, "--child", str(cache)], input=json.dumps(entry), capture_output=True,
                          text=True, cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"engine start failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child(cache: str) -> None:
    """Under the JAX venv: one measured engine start-up on `cache`."""
    from aotc.runners.tpu_inference import records
    from aotc.runners.tpu_inference.session import Session

    session = Session.start(json.load(sys.stdin), cache)
    total = records.totals(records.family_table(session.records(), {}))
    print(json.dumps({"seconds": session.start_seconds, "compiled": total["compiles"], "loaded": total["found"],
                      "requests": total["requests"]}))
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)

    from aotc.fingerprint import runner_python

    python = runner_python("tpu-inference")
    with tempfile.TemporaryDirectory(prefix="aotc-bench-jax-") as tmp:
        work = Path(tmp)
        cache = fetched_cache(work)
        entry = json.loads((cache / "manifest.json").read_text())["build"]["entry"]
        runs = {"cold": [], "warm": []}
        for _ in range(args.repeat):
            empty = work / "cold"
            shutil.rmtree(empty, ignore_errors=True)
            empty.mkdir()
            runs["cold"].append(start_once(python, entry, empty))
            warm = work / "warm"
            shutil.rmtree(warm, ignore_errors=True)
            shutil.copytree(cache, warm)  # the fetched dir stays pristine for the next round
            runs["warm"].append(start_once(python, entry, warm))

    cold = statistics.median(r["seconds"] for r in runs["cold"])
    warm = statistics.median(r["seconds"] for r in runs["warm"])
    for name, rs in runs.items():
        r = rs[-1]
        print(f"{name:4}: engine start-up {statistics.median(x['seconds'] for x in rs):6.1f}s; "
              f"{r['compiled']} graphs compiled, {r['loaded']} loaded from the cache ({r['requests']} cache lookups)")
    print(f"start-up with the fetched cache / cold = {warm / cold:.2f}  ({cold / warm:.2f}x faster)")


if __name__ == "__main__":
    main()
