"""Start-up benchmark with the real server, both backends: stock `vllm serve`, cold vs fetched cache.

For each backend's demo entry (configs/demo.yaml: vllm-tpu, configs/demo-jax.yaml: tpu-inference; the CPU
twin): `aotc build` and `aotc publish` into a temporary store, `aotc fetch` the way a pod's init container
does, then start the same stock `vllm serve` (API server + engine-core process, identical flags and env)
twice per round, each on a private copy: an empty cache dir (cold) and the fetched one. Measured from the
launch: seconds to `/health` 200 and to the first token of one completion, and the warm-up alone (the
guard's start-up check to its ready line: KV cache and graphs compiled or loaded); graphs compiled at start-up and
by that first request, and persistent-cache hits (the aotc guard's counters on /metrics, AOTC_GUARD=1 on
both sides). Then vLLM's own `vllm bench startup` on the same engine arguments: its cold run starts on an
empty VLLM_XLA_CACHE_PATH, its warm runs on what the cold run wrote (in-process engine, its own design).
Figures from one run each (`--repeat N` for medians); nothing here is a pass/fail test.

    AOTC_PYTHON_TPU_INFERENCE=<jax venv>/bin/python python bench/bench_startup.py [--backend tpu-inference]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from aotc.matrix import Entry, load_matrix  # noqa: E402
from aotc.server import serve_command  # noqa: E402
from aotc.testing import stock_server  # noqa: E402

DEMOS = {"vllm-tpu": (REPO / "configs" / "demo.yaml", "tiny-llama--len128-seqs8-tok64-tp1"),
         "tpu-inference": (REPO / "configs" / "demo-jax.yaml", "tiny-llama-jax--len128-seqs8-tok64-tp1")}
PROMPT = [5, 6, 7]


def aotc(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "aotc.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"aotc {args[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def fetched_cache(config: Path, entry: str, work: Path) -> Path:
    """What a pod's init container leaves at VLLM_XLA_CACHE_PATH."""
    aotc("build", config, "--entry", entry, "--out", work / "artifacts", "--traffic", "16")
    aotc("publish", work / "artifacts" / entry, "--store", work / "store")
    aotc("fetch", "--config", config, "--entry", entry, "--dest", work / "pod" / "cache", "--store", work / "store")
    return work / "pod" / "cache"


def one_start(entry: Entry, cache: Path, log: Path) -> dict:
    server = stock_server.start(entry, cache, log, guard="1")
    try:
        ready = server.wait_ready()
        at_ready = stock_server.metrics(server)
        status, body = stock_server.complete(server, PROMPT, max_tokens=1, temperature=0.0)
        first_token = time.monotonic() - server.started_at
        if status != 200:
            raise SystemExit(f"first request failed ({status}): {body}")
        after = stock_server.metrics(server)
    finally:
        server.stop()

    def value(text: str, name: str) -> int:
        return int(sum(stock_server.samples(text, name).values()))

    return {"ready_s": round(ready, 2), "first_token_s": round(first_token, 2),
            "warm_up_s": warm_up_seconds(log),
            "compiled_at_startup": value(at_ready, "aotc_compiles_at_startup_total"),
            "cache_hits_at_startup": value(at_ready, "aotc_cache_hits_total"),
            "compiled_by_first_request": value(after, "aotc_compiles_after_ready_total"),
            "cache_match": value(at_ready, "aotc_cache_match")}


STAMP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")


def warm_up_seconds(log: Path) -> int | None:
    """From the guard's start-up check (model loaded, before the KV cache) to its ready line: the part of
    start-up that compiles or loads graphs (vLLM's log stamps, whole seconds)."""
    stamps = [STAMP.search(line) for line in log.read_text(errors="replace").splitlines() if "aotc guard:" in line]
    stamps = [datetime.strptime(m.group(1), "%m-%d %H:%M:%S") for m in stamps if m]
    return int((stamps[1] - stamps[0]).total_seconds()) if len(stamps) >= 2 else None


def vllm_bench_startup(entry: Entry, work: Path) -> dict:
    """`vllm bench startup` on the same engine args; cold = an empty XLA cache, warm = what cold wrote."""
    cache = work / "bench-startup-xla"
    cache.mkdir()
    command = serve_command(entry, cache, 0, guard=None)
    # `vllm serve MODEL --flags --host H --port P` -> `vllm bench startup --model MODEL --flags`
    argv = [command.argv[0], "bench", "startup", "--model", command.model, *command.argv[3:-4]]
    env = command.process_env()
    out = work / "bench-startup.json"
    proc = subprocess.run([*argv, "--num-iters-cold", "1", "--num-iters-warmup", "1", "--num-iters-warm", "1",
                           "--output-json", str(out)], capture_output=True, text=True, env=env, cwd=work)
    if proc.returncode or not out.exists():
        return {"error": (proc.stderr or proc.stdout)[-600:]}
    data = json.loads(out.read_text())
    # vllm 0.13 and 0.32 both write avg_<phase>_startup_time
    return {"cold_s": round(data["avg_cold_startup_time"], 2), "warm_s": round(data["avg_warm_startup_time"], 2),
            "cold_compilation_s": round(data.get("avg_cold_compilation_time", 0.0), 2),
            "warm_compilation_s": round(data.get("avg_warm_compilation_time", 0.0), 2)}


def bench_backend(name: str, repeat: int, with_vllm_bench: bool) -> dict:
    config, entry_name = DEMOS[name]
    entry = load_matrix(config).entry(entry_name)
    with tempfile.TemporaryDirectory(prefix=f"aotc-bench-startup-{name}-") as tmp:
        work = Path(tmp)
        fetched = fetched_cache(config, entry_name, work)
        runs: dict[str, list[dict]] = {"cold": [], "fetched": []}
        for i in range(repeat):
            for kind in ("cold", "fetched"):
                cache = work / f"{kind}-{i}"
                if kind == "cold":
                    cache.mkdir()
                else:
                    shutil.copytree(fetched, cache)  # the fetched dir stays pristine for the next round
                runs[kind].append(one_start(entry, cache, work / f"{kind}-{i}.log"))
        result = {"backend": name, "entry": entry_name, "runs": runs}
        for key in ("ready_s", "first_token_s"):
            cold = statistics.median(r[key] for r in runs["cold"])
            fetched_s = statistics.median(r[key] for r in runs["fetched"])
            result[f"{key}_ratio"] = round(fetched_s / cold, 2)
        if with_vllm_bench:
            result["vllm_bench_startup"] = vllm_bench_startup(entry, work)
    return result


def render(result: dict) -> str:
    lines = [f"{result['backend']} ({result['entry']}), stock `vllm serve` on the CPU twin:"]
    for kind, runs in result["runs"].items():
        r = runs[-1]
        lines.append(f"  {kind:7}: /health {statistics.median(x['ready_s'] for x in runs):6.1f}s, first token "
                     f"{statistics.median(x['first_token_s'] for x in runs):6.1f}s (warm-up {r['warm_up_s']}s); "
                     f"compiled {r['compiled_at_startup']} "
                     f"at start-up ({r['cache_hits_at_startup']} cache hits, manifest match {r['cache_match']}), "
                     f"{r['compiled_by_first_request']} by the first request")
    lines.append(f"  fetched / cold: ready {result['ready_s_ratio']:.2f}x, first token {result['first_token_s_ratio']:.2f}x")
    if "vllm_bench_startup" in result:
        vb = result["vllm_bench_startup"]
        lines.append("  vllm bench startup: " + (f"cold {vb['cold_s']:.1f}s, warm {vb['warm_s']:.1f}s "
                                               f"(warm / cold {vb['warm_s'] / vb['cold_s']:.2f}x)"
                                               if "cold_s" in vb else f"failed: {vb['error']}"))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=sorted(DEMOS), action="append")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-vllm-bench", action="store_true", help="skip `vllm bench startup`")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [bench_backend(b, args.repeat, not args.no_vllm_bench) for b in args.backend or sorted(DEMOS)]
    print(json.dumps(results, indent=1) if args.json else "\n".join(render(r) for r in results))


if __name__ == "__main__":
    main()
