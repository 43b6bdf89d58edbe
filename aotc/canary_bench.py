"""vLLM's own load generator against the canary's server: ``vllm bench serve`` (random dataset, lengths
spread over the entry's limits, concurrency ``max_num_seqs``), and the wait until it has requests running
so the request kinds join its batches."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from aotc.canary_metrics import metric_sum, scrape_metrics
from aotc.matrix import Entry
from aotc.server import ServerCommand


def bench_lengths(entry: Entry) -> dict[str, str]:
    """Input and output lengths spread over the entry's limits (uniform in [L(1-r), L(1+r)]), every
    request within max_model_len; prompts longer than max_num_batched_tokens are chunked as in a pod."""
    ratio = 0.9
    input_len = max(2, int(entry.max_model_len * 0.30))
    output_len = max(2, int(entry.max_model_len * 0.18))
    return {"--random-input-len": str(input_len), "--random-output-len": str(output_len),
            "--random-range-ratio": str(ratio)}


def run_bench(entry: Entry, command: ServerCommand, work: Path, requests: int, seed: int,
              models: tuple[str, ...] = ()) -> dict[str, Any]:
    """vLLM's own load generator against the server (the runner's ``vllm bench serve``); with LoRA
    ``models`` (the base model and adapters), each request names one of them at random."""
    vllm = command.argv[0]
    argv = [vllm, "bench", "serve", "--backend", "vllm", "--base-url", command.url, "--model", command.model,
            "--tokenizer", command.model, "--dataset-name", "random", "--num-prompts", str(requests),
            "--max-concurrency", str(entry.max_num_seqs), "--request-rate", "inf", "--ignore-eos",
            "--seed", str(seed), "--disable-tqdm", "--save-result", "--result-dir", str(work),
            "--result-filename", "bench.json", "--percentile-metrics", "ttft,tpot,itl,e2el",
            *[x for kv in bench_lengths(entry).items() for x in kv]]
    if len(models) > 1:
        argv += ["--lora-modules", *models]
    # VLLM_PLUGINS="": a process that only sends requests loads no platform or general plugin (the TPU
    # platform, the stack's model registry, JAX: about 3 s of CPU of its 17), as a client on another host would.
    env = {**command.process_env(), "HF_HUB_OFFLINE": "1", "VLLM_PLUGINS": ""}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=max(600, requests * 10))
    (work / "bench.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode or not (work / "bench.json").is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        return {"completed": 0, "failed": requests, "problems": [f"vllm bench serve exited {proc.returncode}:\n{tail}"]}
    doc = json.loads((work / "bench.json").read_text())
    completed = int(doc.get("completed", 0))
    keep = ("completed", "total_input_tokens", "total_output_tokens", "request_throughput", "mean_ttft_ms",
            "max_concurrency", "duration")
    return {**{k: doc[k] for k in keep if k in doc}, "failed": max(0, requests - completed), "problems": []}


def wait_for_load(url: str, load: concurrent.futures.Future, patience: float = 120) -> None:
    """Until the load generator has requests running (so the kinds join its batches), it ended, or
    ``patience`` seconds passed."""
    deadline = time.monotonic() + patience
    while not load.done() and time.monotonic() < deadline:
        if running_requests(url):
            return
        time.sleep(0.2)


def running_requests(url: str) -> float:
    return metric_sum(scrape_metrics(url), "vllm:num_requests_running") or 0
