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
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aotc.canary_requests import Planned, RequestLimits, plan_requests
from aotc.engine_args import lora_module_paths
from aotc.entry import hf_config
from aotc.errors import BadInput
from aotc.manifest import Manifest
from aotc.matrix import Entry, load_matrix
from aotc.runners.lora import ADAPTER_NAME, write_adapter
from aotc.runners.traffic import lora_slots
from aotc.processes import free_port
from aotc.server import Server, ServerCommand, serve_command

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
class KindOutcome:
    sent: int = 0
    ok: int = 0
    rejected: int = 0
    """Requests the stack refused (HTTP 400): its limitation, neither served nor failed."""
    rejected_by_stack: str | None = None
    """The stack's message for the first refusal."""
    failed: int = 0
    not_sent: str | None = None
    """Why the kind was not sent to this entry's server."""
    errors: list[str] = field(default_factory=list)

    def count(self, answer: Answer) -> None:
        self.sent += 1
        if answer.status == "ok":
            self.ok += 1
        elif answer.status == "rejected":
            self.rejected += 1
            self.rejected_by_stack = self.rejected_by_stack or answer.message
        else:
            self.failed += 1
            self.errors = sorted({*self.errors, answer.message})[:3]

    def add(self, other: KindOutcome) -> None:
        self.sent, self.ok, self.failed = self.sent + other.sent, self.ok + other.ok, self.failed + other.failed
        self.rejected += other.rejected
        self.rejected_by_stack = self.rejected_by_stack or other.rejected_by_stack
        self.errors = sorted({*self.errors, *other.errors})[:3]


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
    prefix_cache: dict[str, float] | None = None
    """The server's own prefix-cache counters at the end, in prompt tokens: {"queries", "hits"} (vLLM's
    vllm:prefix_cache_queries / _hits). Hits show the shared-prefix requests took cached blocks (and, on a
    hybrid model, the recurrent state saved with them)."""
    bench: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """What kept the canary from judging: the load generator failed, the server died."""
    failures: list[str] = field(default_factory=list)
    """A sample of the failed requests' errors."""
    adapters: list[str] = field(default_factory=list)
    """LoRA adapters the requests named besides the base model (one loaded at run time among them)."""
    limitations: list[str] = field(default_factory=list)
    """Request options not driven because the stock server of this stack cannot serve them (RunnerSpec.unserved),
    and request kinds the stack refused, with its message."""
    kinds: dict[str, KindOutcome] = field(default_factory=dict)
    """Per request kind (aotc/canary_requests.py): what was sent and how the server answered."""

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
# negative token id that kills the API server's output handler (every request in flight fails with HTTP 500),
# and what tpu-inference's runner cannot do with draft tokens and raises on inside the engine core (the server
# dies): prompt logprobs, and a structured-output bitmask (one row per request) against the logits (one row per
# draft token too).
SPECULATIVE_UNSERVED = {
    "min_p": "vLLM refuses min_p with speculative decoding",
    "logprobs": "with speculative decoding the stack's logprobs at times hold a negative token id, and the API "
                "server's output handler dies detokenizing it (OverflowError; every request in flight fails)",
    "prompt_logprobs": "tpu-inference 0.32 raises 'prompt_logprobs is not supported with speculative decoding' in "
                       "the engine core's step (TPUModelRunner._execute_model), which kills the server",
    **dict.fromkeys(("structured_outputs", "response_format"),
                    "tpu-inference 0.32 applies the grammar bitmask (a row per request) to logits with a row per "
                    "draft token too (StructuredDecodingManager: incompatible shapes), which kills the server"),
}


def unserved_options(entry: Entry) -> dict[str, str]:
    """Request options the stock server cannot serve for this entry: the stack's (RunnerSpec.unserved), and
    with speculative decoding vLLM's own refusals, with images the stack's multimodal ones."""
    unserved = dict(entry.backend.unserved)
    if entry.engine.get("speculative_config"):
        unserved.update(SPECULATIVE_UNSERVED)
    if entry.backend.planner.traffic_images(entry, hf_config(entry)):
        unserved.update(entry.backend.unserved_with_images)
    return unserved


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


def send_kinds(url: str, planned: list[Planned], models: tuple[str, ...],
               timeout: float = 300) -> dict[str, KindOutcome]:
    """Every kind at once, each kind's bodies at once (a ``first_alone`` kind's first body ahead of the rest).
    A body that names no model names ``models[i % len(models)]``, i counting over all kinds' bodies, so base
    model and adapters mix across kinds."""
    named, i = [], 0
    for p in planned:
        bodies = []
        for body in p.bodies:
            bodies.append({"model": models[i % len(models)], **body})
            i += 1
        named.append(bodies)
    structured = threading.Lock()
    with concurrent.futures.ThreadPoolExecutor(max(1, len(planned))) as pool:
        outcomes = list(pool.map(lambda p, bodies: send_kind(url, p, bodies, timeout, structured), planned, named))
    return {p.kind.name: outcome for p, outcome in zip(planned, outcomes)}


def send_kind(url: str, planned: Planned, bodies: list[dict[str, Any]], timeout: float,
              structured: threading.Lock) -> KindOutcome:
    outcome = KindOutcome(not_sent=planned.not_sent)
    waves = [bodies[:1], bodies[1:]] if planned.kind.first_alone else [bodies]
    serial = structured if planned.kind.one_structured_at_a_time else contextlib.nullcontext()

    def one(body: dict[str, Any]) -> Answer:
        with serial:
            return send(url + planned.kind.endpoint, body, timeout)

    for wave in filter(None, waves):
        with concurrent.futures.ThreadPoolExecutor(len(wave)) as pool:
            for answer in pool.map(one, wave):
                outcome.count(answer)
    return outcome


@dataclass(frozen=True)
class Answer:
    status: str
    """ok | rejected (HTTP 400: the stack refused the request) | failed"""
    message: str = ""


def send(url: str, body: dict[str, Any], timeout: float) -> Answer:
    """One request, read to its end (a stream to its ``[DONE]``)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        message = error_message(exc.read())
        return Answer("rejected", message) if exc.code == 400 else Answer("failed", f"HTTP {exc.code}: {message}")
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return Answer("failed", f"request failed: {exc}")
    problem = stream_problem(text) if body.get("stream") else answer_problem(text)
    return Answer("failed", problem) if problem else Answer("ok")


def error_message(raw: bytes) -> str:
    """vLLM's error text: ``{"error": {"message": ...}}`` or ``{"message": ...}``; else the raw start."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return raw[:300].decode(errors="replace")
    if not isinstance(doc, dict):
        return str(doc)[:300]
    error = doc.get("error")
    return str((error.get("message") if isinstance(error, dict) else None) or doc.get("message") or doc)[:300]


def answer_problem(text: str) -> str | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return f"not JSON: {text[:200]}"
    return None if isinstance(doc, dict) and doc.get("choices") else f"no choices: {text[:200]}"


def stream_problem(text: str) -> str | None:
    """An error event, or a stream that ended without ``data: [DONE]``."""
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    for event in events:
        if event != "[DONE]" and ('"error"' in event and '"choices"' not in event):
            return f"error event: {error_message(event.encode())}"
    return None if events and events[-1] == "[DONE]" else f"stream ended without [DONE]: {text[-200:]}"


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
    named = lora_module_paths(entry.engine.get("lora_modules"))
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


# The kinds sent to an adapter loaded at run time: sampling with and without logprobs, and requests naming it.
RUNTIME_KINDS = ("greedy", "sampling", "logprobs", "stop", "lora")


def run_runtime_adapter(command: ServerCommand, entry: Entry, path: str, unserved: dict[str, str],
                        seed: int) -> tuple[dict[str, KindOutcome], str | None]:
    """Load an adapter into the running server, send it and the base model some kinds, unload it.
    Returns the kinds' outcomes and the problem loading or unloading it (None: none)."""
    loaded = post_json(command.url + "/v1/load_lora_adapter", {"lora_name": RUNTIME_ADAPTER, "lora_path": path}, 60)
    if isinstance(loaded, str):
        return {}, f"load_lora_adapter: {loaded}"
    limits = RequestLimits.of(entry, (RUNTIME_ADAPTER,))
    planned = [p for p in plan_requests(limits, seed + 1, dict(unserved)) if p.kind.name in RUNTIME_KINDS]
    outcomes = send_kinds(command.url, planned, (RUNTIME_ADAPTER, command.model))
    unloaded = post_json(command.url + "/v1/unload_lora_adapter", {"lora_name": RUNTIME_ADAPTER}, 60)
    return outcomes, (f"unload_lora_adapter: {unloaded}" if isinstance(unloaded, str) else None)


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


def scrape_metrics(url: str) -> str:
    """vLLM's /metrics text ("" when the server does not answer)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            return response.read().decode()
    except (urllib.error.URLError, OSError):
        return ""


def guard_series(metrics: str) -> dict[str, float] | None:
    """The guard's ``aotc_*`` series (None when this server publishes none)."""
    series = {name + (labels or ""): float(value) for name, labels, value in GUARD_METRIC.findall(metrics)}
    return series or None


def metric_sum(metrics: str, name: str) -> float | None:
    """A series of vLLM's /metrics text summed over its label sets (None when the server publishes none)."""
    values = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", metrics, re.M)
    return sum(float(v) for v in values) if values else None


def prefix_cache_counters(metrics: str) -> dict[str, float] | None:
    """vllm:prefix_cache_queries_total and _hits_total (None when absent)."""
    counters = {name: metric_sum(metrics, f"vllm:prefix_cache_{name}_total") for name in ("queries", "hits")}
    return {name: value for name, value in counters.items() if value is not None} or None
