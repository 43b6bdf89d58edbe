"""``aotc canary``: what a pod runs, as separate processes, and whether it compiled anything the cache lacks.

1. ``aotc fetch`` into a fresh directory (the pod's init container; the canary's private cache copy).
2. The stock ``vllm serve`` of the entry (aotc/server.py) with ``AOTC_GUARD=strict``; wait for ``/health``.
3. vLLM's own ``vllm bench serve`` (random dataset, lengths spread over the entry's limits, concurrency
   ``max_num_seqs``) plus OpenAI-API requests covering the sampling knobs, greedy and random in one batch.
   An entry with ``enable_lora`` serves an adapter (the matrix's ``lora_modules``, else a random one shaped
   for the model, aotc/runners/lora.py); every load names the base model and the adapters mixed, and one
   more adapter is loaded at run time (``/v1/load_lora_adapter``), sent requests and unloaded.
4. Evidence, strongest first: files the server wrote into the private cache (a new file is a graph the
   artifact lacks; a rewritten one a cached graph compiled again, torch_xla 2.9.0's case); the runner's
   own cache log where it has one (tpu-inference: JAX's per-lookup hit / miss lines, by phase); the
   guard's counters on ``/metrics``. Then a clean stop.

Exit 0 only if nothing compiled that the artifact lacks; 1 naming each graph that did (or any failed
request). On a stack whose cache does not load, recompiles of cached graphs are counted and reported
under the loadability verdict, never a pass for loading.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aotc.errors import BadInput
from aotc.manifest import Manifest
from aotc.matrix import Entry, load_matrix
from aotc.runners.lora import ADAPTER_NAME, write_adapter
from aotc.runners.spec import load_runner
from aotc.runners.traffic import lora_slots
from aotc.server import Server, ServerCommand, free_port, lora_module_map, serve_command

LOADABILITY_REFERENCE = "pytorch/xla#9094"
# The guard's series on vLLM's /metrics (aotc/guard_metrics.py), e.g. aotc_compiles_after_ready_total{family="cached"} 1.0
GUARD_METRIC = re.compile(r"^(aotc_[a-z_]+)(\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M)


@dataclass
class Snapshot:
    """name -> (size, mtime_ns) of every cache file."""

    files: dict[str, tuple[int, int]]

    @classmethod
    def of(cls, root: Path) -> Snapshot:
        files = {}
        for path in root.rglob("*"):
            if path.is_file() and path.name != "manifest.json":
                st = path.stat()
                files[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
        return cls(files)

    def new_since(self, before: Snapshot) -> list[str]:
        return sorted(set(self.files) - set(before.files))

    def rewritten_since(self, before: Snapshot) -> list[str]:
        return sorted(k for k in self.files.keys() & before.files.keys() if self.files[k] != before.files[k])


@dataclass
class Phase:
    """What one phase (start-up, or serving after ready) compiled."""

    new_files: list[str] = field(default_factory=list)
    rewritten_files: list[str] = field(default_factory=list)
    lookups: int | None = None
    hits: int | None = None
    misses: list[str] = field(default_factory=list)

    @property
    def missing(self) -> list[str]:
        """Cache keys compiled that the artifact lacks (files, and log misses the files do not show)."""
        return sorted(set(self.new_files) | set(self.misses))


@dataclass
class CanaryResult:
    entry: str
    runner: str
    fingerprint: str
    loadable: bool | None
    requests: int = 0
    failed_requests: int = 0
    ready_seconds: float | None = None
    startup: Phase = field(default_factory=Phase)
    serving: Phase = field(default_factory=Phase)
    graphs_missing: list[str] = field(default_factory=list)
    guard: dict[str, float] | None = None
    bench: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """What kept the canary from judging: the load generator failed, the server died."""
    failures: list[str] = field(default_factory=list)
    """A sample of the failed requests' errors."""
    adapters: list[str] = field(default_factory=list)
    """LoRA adapters the requests named besides the base model (one loaded at run time among them)."""
    limitations: list[str] = field(default_factory=list)
    """Request options not driven because the stock server of this stack cannot serve them (RunnerSpec.unserved)."""

    @property
    def compiles_at_startup(self) -> int:
        return len(self.startup.missing) + len(self.startup.rewritten_files)

    @property
    def compiles_after_ready(self) -> int:
        return len(self.serving.missing) + len(self.serving.rewritten_files)

    @property
    def strict_failed_cached(self) -> int:
        """Requests AOTC_GUARD=strict failed because their step compiled a graph the cache holds (a stack
        that cannot load it, torch_xla 2.9.0): the loadability verdict's, not coverage's. 0 unless every
        compile the guard saw after ready was of a cached graph."""
        guard = self.guard or {}
        after = {k: v for k, v in guard.items() if k.startswith("aotc_compiles_after_ready_total")}
        if not after or any(v and 'family="cached"' not in k for k, v in after.items()):
            return 0
        return int(guard.get("aotc_requests_failed_total", 0))

    @property
    def unexplained_failures(self) -> int:
        return max(0, self.failed_requests - self.strict_failed_cached)

    @property
    def ok(self) -> bool:
        return not self.graphs_missing and not self.unexplained_failures and not self.problems

    @property
    def verdict(self) -> str:
        if not self.ok:
            named = "; ".join(self.graphs_missing[:10]) or "; ".join(p.splitlines()[0] for p in self.problems[:3])
            return f"{self.runner}: FAILED: {named or f'{self.unexplained_failures} failed request(s): {self.failures[:1]}'}"
        recompiled = len(self.startup.rewritten_files) + len(self.serving.rewritten_files)
        if recompiled:
            failed = (f"; AOTC_GUARD=strict failed {self.failed_requests} request(s) whose step recompiled one"
                      if self.failed_requests else "")
            return (f"{self.runner}: every graph covered over {self.requests} requests; {recompiled} recompiled "
                    f"because this stack cannot load its cache ({LOADABILITY_REFERENCE}){failed}")
        return f"{self.runner}: 0 compiles after ready over {self.requests} requests"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(ok=self.ok, verdict=self.verdict, compiles_at_startup=self.compiles_at_startup,
                    compiles_after_ready=self.compiles_after_ready, strict_failed_cached=self.strict_failed_cached)
        return data


# --- the run -----------------------------------------------------------------------------------------


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
        manifest = fetch(config, entry.name, store, cache, command)
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


def fetch(config: str, entry: str, store: str | None, dest: Path, command: ServerCommand) -> Manifest:
    """The init container: ``aotc fetch`` as its own process, with the pod's environment (the fingerprint's
    flags and runner variables are the server's)."""
    from aotc.errors import AotcError, IntegrityError, NotFoundInStore

    argv = [sys.executable, "-m", "aotc.cli", "fetch", "--config", config, "--entry", entry, "--dest", str(dest)]
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
    cache_log = runner_cache_log(entry.runner)
    command = ServerCommand(command.argv, {**command.env, **cache_log.get("env", {})}, command.host, command.port)
    server_log = work / "server.log"
    before = Snapshot.of(cache)
    log(f"start {' '.join(command.argv[:3])} ... on port {command.port}")
    with Server(command, server_log).start() as server:
        result.ready_seconds = round(server.wait_ready(), 2)
        ready_offset = server_log.stat().st_size
        at_ready = Snapshot.of(cache)
        log(f"ready after {result.ready_seconds} s; driving {requests} requests")
        models = adapters.models(command.model)
        bench = run_bench(entry, command, work, requests, seed, models)
        unserved = unserved_options(entry)
        result.limitations = [f"{option} not requested: {why}" for option, why in unserved.items()]
        mix = run_sampling_mix(command, entry, skip=tuple(unserved), models=models)
        result.adapters = list(adapters.named)
        if adapters.runtime:
            runtime = run_runtime_adapter(command, entry, adapters.runtime, tuple(unserved))
            mix = merge_counts(mix, runtime)
            result.adapters += [RUNTIME_ADAPTER] if runtime["completed"] else []
        result.bench = bench
        result.requests = bench.get("completed", 0) + mix["completed"]
        result.failed_requests = bench.get("failed", 0) + mix["failed"]
        result.problems += bench.get("problems", []) + mix.get("problems", [])
        result.failures = mix["errors"]
        result.guard = scrape_guard(command.url)
        server.stop()
    after = Snapshot.of(cache)
    text = server_log.read_text(errors="replace")
    result.startup = phase(before, at_ready, text[:ready_offset], cache_log)
    result.serving = phase(at_ready, after, text[ready_offset:], cache_log)
    if result.unexplained_failures or result.problems:
        result.failures.append(f"server log tail:\n{server.tail(15)}")


def phase(before: Snapshot, after: Snapshot, log_text: str, cache_log: dict[str, Any]) -> Phase:
    p = Phase(new_files=[cache_key(f) for f in after.new_since(before)],
              rewritten_files=[cache_key(f) for f in after.rewritten_since(before)])
    if cache_log.get("hit"):
        hits = re.findall(cache_log["hit"], log_text)
        misses = re.findall(cache_log["miss"], log_text)
        p.lookups, p.hits = len(hits) + len(misses), len(hits)
        p.misses = sorted({key for _, key in misses})
    return p


def cache_key(path: str) -> str:
    """A cache file's key: its name without the stack's suffix (JAX writes ``<key>-cache``)."""
    return path.removesuffix("-cache")


def runner_cache_log(runner: str) -> dict[str, Any]:
    """The runner's per-lookup log, if its stack has one: {"env": ..., "hit": regex, "miss": regex}, each
    regex with two groups (graph name, cache key). Logging only: no key changes."""
    spec = load_runner(runner)
    return spec.load("cache_log")() if spec.cache_log else {}


def name_graphs(manifest: Manifest, keys: Iterable[str]) -> list[str]:
    """``family {shape} (key)`` for keys the manifest's graphs name, else the key itself."""
    by_key = {}
    for graph in manifest.graphs:
        for key in graph.keys:
            by_key[cache_key(Path(key).name)] = f"{graph.family} {json.dumps(graph.shape, sort_keys=True)}"
    names = []
    for key in sorted(set(keys)):
        base = Path(key).name
        names.append(f"{by_key[base]} ({base[:60]})" if base in by_key else base[:100])
    return names


# --- load ----------------------------------------------------------------------------------------------


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
    env = {**command.process_env(), "HF_HUB_OFFLINE": "1"}
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


# With speculative decoding: what vLLM's front end refuses (HTTP 400: "The min_p and logit_bias sampling
# parameters are not yet supported with speculative decoding"), and sampled-token logprobs, which at times carry a
# negative token id that kills the API server's output handler (every request in flight fails with HTTP 500).
SPECULATIVE_UNSERVED = {
    "min_p": "vLLM refuses min_p with speculative decoding",
    "logprobs": "with speculative decoding the stack's logprobs at times hold a negative token id, and the API "
                "server's output handler dies detokenizing it (OverflowError; every request in flight fails)",
}


def unserved_options(entry: Entry) -> dict[str, str]:
    """Request options the stock server cannot serve for this entry: the stack's (RunnerSpec.unserved), and
    with speculative decoding vLLM's own refusals."""
    unserved = dict(load_runner(entry.runner).unserved)
    if entry.engine.get("speculative_config"):
        unserved.update(SPECULATIVE_UNSERVED)
    return unserved


def sampling_mix(entry: Entry) -> list[dict[str, Any]]:
    """One request per sampling knob, greedy and random together; sent at once so they share batches.
    No per-request seed: tpu-inference rejects it ("JAX does not support per-request seed")."""
    budget = max(2, entry.max_model_len // 4)
    base = {"prompt": "the cache is warm and the pod", "max_tokens": budget}
    return [
        {**base, "temperature": 0.0},
        {**base, "temperature": 0.0, "logprobs": 3},
        {**base, "temperature": 0.9},
        {**base, "temperature": 0.8, "top_p": 0.9},
        {**base, "temperature": 0.7, "top_k": 20},
        {**base, "temperature": 1.0, "min_p": 0.05},
        {**base, "temperature": 0.8, "top_p": 0.95, "top_k": 50, "min_p": 0.02, "logprobs": 5},
        {**base, "temperature": 0.0, "stop": ["e", "\n"], "max_tokens": 8},
        {**base, "temperature": 0.6, "max_tokens": 1},
        {**base, "temperature": 0.0, "max_tokens": budget * 2, "logprobs": 1},
    ]


def run_sampling_mix(command: ServerCommand, entry: Entry, skip: tuple[str, ...] = (),
                     timeout: float = 300, models: tuple[str, ...] = ()) -> dict[str, Any]:
    """The mix at once; request i names ``models[i % len(models)]`` (default: the base model alone)."""
    models = models or (command.model,)
    bodies = [{**{k: v for k, v in b.items() if k not in skip}, "model": models[i % len(models)]}
              for i, b in enumerate(sampling_mix(entry))]
    # Twice at once: a batch of max_num_seqs mixing every knob, greedy with random.
    bodies = (bodies * (1 + entry.max_num_seqs // len(bodies)))[:max(entry.max_num_seqs, len(bodies))]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        outcomes = list(pool.map(lambda b: post_json(command.url + "/v1/completions", b, timeout), bodies))
    failed = [o for o in outcomes if isinstance(o, str)]
    return {"completed": len(outcomes) - len(failed), "failed": len(failed), "errors": sorted(set(failed))[:3]}


# --- LoRA ---------------------------------------------------------------------------------------------

# vLLM's switch for /v1/load_lora_adapter and /v1/unload_lora_adapter (a pod-only setting: no graph).
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
RUNTIME_ADAPTER = "aotc-lora-runtime"


@dataclass(frozen=True)
class Adapters:
    served: dict[str, str] = field(default_factory=dict)
    """name -> dir the stock server is started with (besides those the matrix names)."""
    named: tuple[str, ...] = ()
    """Every adapter name the server serves from start (the matrix's and ``served``)."""
    runtime: str | None = None
    """An adapter dir to load at run time, send requests to and unload; None: no LoRA."""

    def models(self, base: str) -> tuple[str, ...]:
        return (base, *self.named)


def canary_adapters(entry: Entry, work: Path) -> Adapters:
    """The adapters of an entry with enable_lora: the matrix's ``lora_modules`` if it names any, else a
    random one written for the model (graphs depend on max_loras / max_lora_rank, not on an adapter)."""
    if not lora_slots(entry.engine):
        return Adapters()
    named = lora_module_map(entry.engine.get("lora_modules"))
    config_path = entry.model_config_path
    if config_path is None:
        if not named:
            raise BadInput(f"canary: {entry.name} enables LoRA but names no lora_modules, and its model has no "
                           "local config.json to shape a test adapter for")
        return Adapters(named=tuple(named), runtime=next(iter(named.values())))
    rank = min(8, int(entry.engine.get("max_lora_rank") or 8))
    path = str(write_adapter(work / "lora", json.loads(config_path.read_text()), rank=rank))
    served = {} if named else {ADAPTER_NAME: path}
    return Adapters(served=served, named=tuple({**named, **served}), runtime=path)


def run_runtime_adapter(command: ServerCommand, entry: Entry, path: str, skip: tuple[str, ...]) -> dict[str, Any]:
    """Load an adapter into the running server, send the mix to it and the base model, unload it."""
    loaded = post_json(command.url + "/v1/load_lora_adapter", {"lora_name": RUNTIME_ADAPTER, "lora_path": path}, 60)
    if isinstance(loaded, str):
        return {"completed": 0, "failed": 0, "errors": [], "problems": [f"load_lora_adapter: {loaded}"]}
    mix = run_sampling_mix(command, entry, skip=skip, models=(RUNTIME_ADAPTER, command.model))
    unloaded = post_json(command.url + "/v1/unload_lora_adapter", {"lora_name": RUNTIME_ADAPTER}, 60)
    if isinstance(unloaded, str):
        mix["problems"] = [f"unload_lora_adapter: {unloaded}"]
    return mix


def merge_counts(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"completed": a["completed"] + b["completed"], "failed": a["failed"] + b["failed"],
            "errors": (a["errors"] + b["errors"])[:3], "problems": a.get("problems", []) + b.get("problems", [])}


def post_json(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any] | str:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read()
        try:
            return json.loads(text)
        except ValueError:  # /v1/load_lora_adapter answers 200 with plain text
            return {"text": text.decode(errors="replace")}
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} for {sorted(k for k in body if k not in ('prompt', 'model'))}: {exc.read()[:200]!r}"
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return f"request failed ({sorted(k for k in body if k not in ('prompt', 'model'))}): {exc}"


def scrape_guard(url: str) -> dict[str, float] | None:
    """The guard's ``aotc_*`` series from vLLM's /metrics (None when this server publishes none)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    series = {name + (labels or ""): float(value) for name, labels, value in GUARD_METRIC.findall(text)}
    return series or None


def render_canary(result: CanaryResult, console) -> None:
    s, r = result.startup, result.serving
    console.print(f"[bold]{result.entry}[/bold]  {result.fingerprint[:12]}  ready {result.ready_seconds} s, "
                  f"{result.requests} requests ({result.failed_requests} failed)")
    lookups = f", {s.hits}/{s.lookups} lookups hit" if s.lookups is not None else ""
    console.print(f"  start-up: {len(s.missing)} graphs the cache lacks, {len(s.rewritten_files)} cached graphs "
                  f"recompiled{lookups}")
    console.print(f"  after ready: {len(r.missing)} graphs the cache lacks, {len(r.rewritten_files)} cached graphs "
                  f"recompiled" + (f", {r.hits}/{r.lookups} lookups hit" if r.lookups is not None else ""))
    for name in result.graphs_missing:
        console.print(f"  [red]compiled, not in the cache:[/red] {name}")
    for problem in result.problems:
        console.print(f"  [red]problem:[/red] {problem}")
    style = "red" if result.unexplained_failures else "yellow"  # yellow: strict on a recompiled cached graph
    for failure in result.failures:
        console.print(f"  [{style}]failed request:[/{style}] {failure}")
    for limitation in result.limitations:
        console.print(f"  [yellow]limitation:[/yellow] {limitation}")
    if result.guard:
        console.print("  guard: " + ", ".join(f"{k} {v:g}" for k, v in sorted(result.guard.items())))
    console.print(result.verdict)
