"""Runs under the JAX venv (tests/tpu_inference/conftest.py: run_jax): a user's ``LLM(...)`` on a fetched cache
with the stock server's engine arguments and environment (the runner's serve settings) and ``environ`` on top
(the process layout, e.g. ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: one process), then the seeded traffic sweep.
No aotc instrumentation: only vLLM and the general plugins it loads itself.

stdin: {"config", "entry", "cache_dir", "seed", "requests", "environ"}
stdout (last line): {"startup_new": [...], "traffic_new": [...], "requests": N, "xla_flags": [...]}
"""

import json
import os
import sys
from pathlib import Path

from aotc.fingerprint import pin_kv
from aotc.matrix import load_matrix
from aotc.runners.flags import xla_flags
from aotc.runners.vllm_engine import apply_env, llm_args
from aotc.runners.tpu_inference.engine import serve_settings
from aotc.runners.tpu_inference.session import drive_traffic


def cache_files(cache_dir: Path) -> set[str]:
    return {p.name for p in cache_dir.iterdir() if p.is_file() and p.name != "manifest.json"}


def main() -> None:
    payload = json.load(sys.stdin)
    cache_dir = Path(payload["cache_dir"])
    # the KV block count the artifact was built for, from its fetched manifest, as a pod's flags pin it
    published = json.loads((cache_dir / "manifest.json").read_text())["inputs"]["kv_blocks"]
    entry = pin_kv(load_matrix(payload["config"]).entry(payload["entry"]), kv_blocks=published)
    args, env = serve_settings(entry, str(cache_dir))
    apply_env({**env, **payload["environ"]})
    fetched = cache_files(cache_dir)

    from vllm import LLM

    # Prompts are token ids; the tokenizer changes no graph.
    llm = LLM(**llm_args(args), skip_tokenizer_init=True, disable_log_stats=True)
    started = cache_files(cache_dir)
    sent = drive_traffic(llm, entry, payload["seed"], payload["requests"])
    served = cache_files(cache_dir)
    answer = {"startup_new": sorted(started - fetched), "traffic_new": sorted(served - started), "requests": sent,
              "xla_flags": xla_flags(dict(os.environ))}
    # Stop the engine (an engine-core process too, in a multiprocessing layout; its shutdown logs to stdout),
    # answer, then leave without vLLM's exit-time cleanup, which would log after the answer (and whose
    # finalizer that walks model.modules() fails on a JAX model).
    llm.llm_engine.engine_core.shutdown()
    print(json.dumps(answer), flush=True)
    os._exit(0)

if __name__ == "__main__":
    main()
