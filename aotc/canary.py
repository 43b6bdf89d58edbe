"""``aotc canary``: what a pod runs, as separate processes, and whether it compiled anything the cache lacks.

1. ``aotc fetch`` into a fresh directory (the pod's init container; the canary's private cache copy).
2. The stock ``vllm serve`` of the entry (aotc/server.py) with ``AOTC_GUARD=strict``; wait for ``/health``.
3. vLLM's own ``vllm bench serve`` (random dataset, lengths spread over the entry's limits, concurrency
   ``max_num_seqs``) and, while it runs, so they share its batches, the request kinds users send
   (aotc/canary_requests.py: sampling, penalties, n, logprobs, structured outputs, chat, streaming, prompts
   chunked across steps, shared prefixes, ...). A kind the stack refuses is its limitation, not a request
   served. An entry with ``enable_lora`` serves an adapter (the matrix's ``lora_modules``, else a random one
   shaped for the model, aotc/runners/lora.py); every load names the base model and the adapters mixed, and
   one more adapter is loaded at run time (``/v1/load_lora_adapter``), sent requests and unloaded. A
   vision-language entry also gets chat requests with images of the sizes the runner's plan names.
4. Evidence, strongest first: files the server wrote into the private cache (a new file is a graph the
   artifact lacks; a rewritten one a cached graph compiled again, torch_xla 2.9.0's case); the runner's
   own cache log where it has one (tpu-inference: JAX's per-lookup hit / miss lines, by phase); the
   guard's counters on ``/metrics``. Then a clean stop.

Exit 0 only if nothing compiled that the artifact lacks; 1 naming each graph that did (or any failed
request). On a stack whose cache does not load, recompiles of cached graphs are counted and reported
under the loadability verdict, never a pass for loading.

Here: the run, steps 1 to 4 in order. The parts: the load generator (aotc/canary_bench.py), the request
kinds sent and their answers (aotc/canary_send.py), the adapters (aotc/canary_lora.py), the server's
``/metrics`` (aotc/canary_metrics.py), the evidence and the verdict (aotc/canary_verdict.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import subprocess
import sys
import tempfile
from pathlib import Path

from aotc.canary_bench import run_bench, wait_for_load
from aotc.canary_lora import RUNTIME_ADAPTER, RUNTIME_LORA_ENV, Adapters, canary_adapters, run_runtime_adapter
from aotc.canary_metrics import guard_series, prefix_cache_counters, scrape_metrics
from aotc.canary_requests import RequestLimits, plan_requests, unserved_options
from aotc.canary_send import send_kinds
from aotc.canary_verdict import CanaryResult, Snapshot, name_graphs, phase_between
from aotc.errors import BadInput
from aotc.manifest import Manifest
from aotc.entry import hf_config
from aotc.matrix import Entry, load_matrix
from aotc.processes import free_port
from aotc.server import Server, ServerCommand, serve_command


def run_canary(config: str, entry_name: str, store: str | None = None, requests: int = 64,
               work_dir: str | None = None, seed: int = 0, log=None) -> CanaryResult:
    log = log or (lambda msg: print(f"aotc canary: {msg}", file=sys.stderr, flush=True))
    matrix = load_matrix(config)
    entry = matrix.entry(entry_name)
    with _work_dir(work_dir) as work:
        cache = work / "cache"
        adapters = canary_adapters(entry, work)
        command = serve_command(entry, cache, free_port(), guard="strict", lora_modules=adapters.served)
        if adapters.runtime:
            command.env[RUNTIME_LORA_ENV] = "1"
        log(f"fetch {entry.name} into {cache}")
        manifest = fetch_as_init_container(config, entry.name, store, cache, command)
        result = CanaryResult(entry=entry.name, runner=entry.runner, fingerprint=manifest.fingerprint,
                              loadable=manifest.verify.loadable if manifest.verify else None)
        run_server(entry, command, cache, work, manifest, result, requests, seed, log, adapters)
        result.graphs_missing = name_graphs(manifest, result.startup.missing + result.serving.missing)
        return result


@contextlib.contextmanager
def _work_dir(keep: str | None):
    """``keep``: this directory, left in place (server and bench logs); else a temporary one."""
    if keep:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        if (path / "cache").exists():
            raise BadInput(f"canary --work-dir {keep} already holds a cache; give a fresh directory")
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="aotc-canary-") as tmp:
        yield Path(tmp)


def fetch_as_init_container(config: str, entry_name: str, store: str | None, dest: Path,
                            command: ServerCommand) -> Manifest:
    """The init container: ``aotc fetch`` as its own process, with the pod's environment (the fingerprint's
    flags and runner variables are the server's)."""
    from aotc.errors import AotcError, IntegrityError, NotFoundInStore

    argv = [sys.executable, "-m", "aotc.cli", "fetch", "--config", config, "--entry", entry_name,
            "--dest", str(dest)]
    if store:
        argv += ["--store", store]
    proc = subprocess.run(argv, capture_output=True, text=True, env={**command.process_env(), "AOTC_NO_PROGRESS": "1"})
    if proc.returncode:
        message = (proc.stderr.strip().splitlines() or [f"aotc fetch exited {proc.returncode}"])[-1]
        errors = {2: BadInput, 3: NotFoundInStore, 4: IntegrityError}
        raise errors.get(proc.returncode, AotcError)(f"canary fetch: {message.removeprefix('aotc: ').removeprefix('error: ')}")
    return Manifest.load(dest)


def run_server(entry: Entry, command: ServerCommand, cache: Path, work: Path, manifest: Manifest,
               result: CanaryResult, requests: int, seed: int, log, adapters: Adapters | None = None) -> None:
    adapters = adapters or Adapters()
    cache_log = entry.backend.cache_log()
    command = ServerCommand(command.argv, {**command.env, **cache_log.get("env", {})}, command.host, command.port)
    server_log = work / "server.log"
    before = Snapshot.of(cache)
    log(f"start {' '.join(command.argv[:3])} ... on port {command.port}")
    with Server(command, server_log).start() as server:
        result.ready_seconds = round(server.wait_ready(), 2)
        ready_offset = server_log.stat().st_size
        at_ready = Snapshot.of(cache)
        log(f"ready after {result.ready_seconds} s; driving {requests} requests and the request kinds")
        models = adapters.models(command.model)
        unserved = unserved_options(entry)
        result.limitations = [f"{option} not requested: {why}" for option, why in unserved.items()]
        images = entry.backend.planner.traffic_images(entry, hf_config(entry))
        planned = plan_requests(RequestLimits.of(entry, adapters.named, images), seed, unserved)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            load = pool.submit(run_bench, entry, command, work, requests, seed, models)
            wait_for_load(command.url, load)
            result.kinds = send_kinds(command.url, planned, models)
            result.bench = load.result()
        result.adapters = list(adapters.named)
        if adapters.runtime:
            runtime, problem = run_runtime_adapter(command, entry, adapters.runtime, unserved, seed)
            for name, outcome in runtime.items():
                result.kinds[name].add(outcome)
            result.problems += [problem] if problem else []
            result.adapters += [RUNTIME_ADAPTER] if sum(o.ok for o in runtime.values()) else []
        outcomes = result.kinds.values()
        result.requests = result.bench.get("completed", 0) + sum(o.ok for o in outcomes)
        result.failed_requests = result.bench.get("failed", 0) + sum(o.failed for o in outcomes)
        result.problems += result.bench.get("problems", [])
        result.failures = [f"{name}: {error}" for name, o in result.kinds.items() for error in o.errors][:5]
        result.limitations += [f"{name} rejected by the stack: {o.rejected_by_stack}"
                               for name, o in result.kinds.items() if o.rejected_by_stack]
        metrics = scrape_metrics(command.url)
        result.guard = guard_series(metrics)
        result.prefix_cache = prefix_cache_counters(metrics)
        server.stop()
    after = Snapshot.of(cache)
    text = server_log.read_text(errors="replace")
    result.startup = phase_between(before, at_ready, text[:ready_offset], cache_log)
    result.serving = phase_between(at_ready, after, text[ready_offset:], cache_log)
    if result.unexplained_failures or result.problems:
        result.failures.append(f"server log tail:\n{server.tail(15)}")
