"""The aotc guard: a vLLM general plugin (group ``vllm.general_plugins``) that watches a serving pod.

vLLM calls ``register()`` in every one of its processes whenever aotc is installed, so this module
must cost nothing when ``AOTC_GUARD`` is unset: it imports only the standard library at module level,
and ``register()`` returns before touching anything else.

With ``AOTC_GUARD=1`` (or ``strict``) it patches vLLM's ``TPUWorker`` when that module is imported —
subclasses such as aotc's CPU twin call ``super()`` and are covered too:

* ``init_device``: compare ``$VLLM_XLA_CACHE_PATH/manifest.json`` (written by ``aotc fetch``) with this
  engine's fingerprint, and log one line: matching, mismatched (naming the differing inputs) or absent.
* ``compile_or_warm_up_model``: mark the end of warm-up; compiles before it are expected.
* ``execute_model`` / ``sample_tokens``: after each call, read three counters (no device sync) and
  log every XLA compile, persistent-cache miss or dynamo graph that appeared since the last step,
  with the step's padded shape and the graph families the manifest lacks for it. ``strict`` raises.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

ENV_GUARD = "AOTC_GUARD"
ENV_ACCELERATOR = "AOTC_ACCELERATOR"
GKE_ACCELERATOR_ENV = "TPU_ACCELERATOR_TYPE"  # set by GKE/TPU VMs, e.g. "v6e-8"
TWIN_ENV = "AOTC_CPU_TWIN"  # aotc.runners.vllm_tpu.cpu_platform.ENV_FLAG, without importing it
TPU_WORKER_MODULE = "vllm.v1.worker.tpu_worker"
LAUNCH_FLAGS_ENV = "AOTC_GUARD_LAUNCH_FLAGS"
XLA_COUNTERS = ("UncachedCompile", "PersistentCacheMiss")
DYNAMO_GRAPHS = "DynamoGraphs"

# Engine args vLLM rewrites before a worker sees them (TPU replaces block_size with its page size):
# the running config cannot tell what was asked for, so the manifest's value stands in.
UNOBSERVABLE_ENGINE_ARGS = ("block_size",)
ENGINE_ARGS: dict[str, Callable[[Any], Any]] = {
    "kv_cache_dtype": lambda c: c.cache_config.cache_dtype,
    "quantization": lambda c: c.model_config.quantization,
    "enable_prefix_caching": lambda c: c.cache_config.enable_prefix_caching,
    "max_logprobs": lambda c: c.model_config.max_logprobs,
    "enable_lora": lambda c: c.lora_config is not None,
    "max_loras": lambda c: c.lora_config.max_loras if c.lora_config else None,
    "max_lora_rank": lambda c: c.lora_config.max_lora_rank if c.lora_config else None,
    "disable_chunked_mm_input": lambda c: c.scheduler_config.disable_chunked_mm_input,
}

# Which shape fields of a step decide each graph family sample_tokens runs (vllm 0.13 TPUModelRunner).
STEP_FAMILIES: dict[str, tuple[str, ...]] = {
    "backbone": ("num_tokens",),
    "select_hidden_states": ("num_tokens", "num_reqs"),
    "compute_logits": ("num_reqs",),
    "sample_from_logits": ("num_reqs", "all_greedy"),
    "gather_logprobs": ("num_reqs",),
}

logger = logging.getLogger("vllm.aotc.guard")  # a child of vLLM's logger: its format, level, handler


class CompiledAfterWarmUp(RuntimeError):
    """AOTC_GUARD=strict: the server compiled a graph in the middle of serving."""


def guard_mode(environ: Mapping[str, str] | None = None) -> str | None:
    """None (off), "log" or "strict"."""
    value = (os.environ if environ is None else environ).get(ENV_GUARD, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return None
    return "strict" if value == "strict" else "log"


def register() -> None:
    """vLLM's general-plugin hook; may run several times per process."""
    if guard_mode() is None:
        return
    remember_launch_flags()
    when_imported(TPU_WORKER_MODULE, patch_worker)


def remember_launch_flags(environ: dict[str, str] | Any = None) -> None:
    """Record XLA_FLAGS / LIBTPU_INIT_ARGS as the pod set them, for this process and its children.

    torch_xla (on import) and vLLM's TPUWorker (in init_device) append their own flags; ``aotc build``
    fingerprints before either runs. vLLM loads general plugins before it imports torch_xla, so the
    first process records the launch flags and the engine and worker processes inherit the record.
    """
    environ = os.environ if environ is None else environ
    if LAUNCH_FLAGS_ENV not in environ and "torch_xla" not in sys.modules:
        environ[LAUNCH_FLAGS_ENV] = launch_flags_record(environ)


def launch_flags_record(environ: Mapping[str, str]) -> str:
    from aotc.fingerprint import FLAG_ENV_VARS

    return json.dumps({var: environ.get(var) for var in FLAG_ENV_VARS})


def launch_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the flag variables as recorded at launch (unchanged when nothing was recorded)."""
    merged = dict(environ)
    for var, value in json.loads(environ.get(LAUNCH_FLAGS_ENV) or "{}").items():
        if value is None:
            merged.pop(var, None)
        else:
            merged[var] = value
    return merged


# --- start-up: the cache's manifest against this engine -------------------------------------------


@dataclass(frozen=True)
class CacheCheck:
    status: str  # match | mismatch | absent | unreadable
    line: str
    differences: tuple[str, ...] = ()
    entry: str | None = None
    graphs: tuple | None = None  # the manifest's GraphRecords (None: no manifest), to name what a compile lacked


def running_entry(vllm_config: Any, manifest: Any = None, environ: Mapping[str, str] | None = None):
    """The matrix Entry this engine is, read from its VllmConfig (what the pod really runs)."""
    from aotc.matrix import Entry

    environ = os.environ if environ is None else environ
    published = manifest.inputs if manifest is not None else {}
    model_cfg, model = vllm_config.model_config, vllm_config.model_config.model
    dtype = str(model_cfg.dtype).removeprefix("torch.")
    return Entry(
        name=manifest.entry if manifest is not None else "running",
        model_name=os.path.basename(model.rstrip("/")), model=model,
        revision=model_cfg.revision or "main",  # vLLM's None is the hub's default branch, the matrix's "main"
        runner="vllm-tpu",
        device="cpu" if environ.get(TWIN_ENV) == "1" else "tpu",
        accelerator=(environ.get(ENV_ACCELERATOR) or environ.get(GKE_ACCELERATOR_ENV)
                     or published.get("accelerator") or "unknown"),
        # vLLM resolves "auto" before a worker exists; only the manifest remembers it was asked for
        dtype="auto" if published.get("dtype") == "auto" else dtype,
        max_model_len=model_cfg.max_model_len,
        max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
        max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
        tensor_parallel_size=vllm_config.parallel_config.tensor_parallel_size,
        engine=_engine_args(vllm_config, published.get("engine") or {}),
        model_path=os.path.abspath(model) if os.path.isdir(model) else None,
    )


def _engine_args(vllm_config: Any, published: dict[str, Any]) -> dict[str, Any]:
    """The engine args the manifest's matrix entry set, as this engine has them."""
    return {key: value if key in UNOBSERVABLE_ENGINE_ARGS or key not in ENGINE_ARGS
            else ENGINE_ARGS[key](vllm_config) for key, value in published.items()}


def check_cache(cache_dir: str, vllm_config: Any, environ: Mapping[str, str] | None = None) -> CacheCheck:
    from aotc.errors import IntegrityError
    from aotc.fingerprint import describe_diff, digest_of, fingerprint_inputs
    from aotc.manifest import MANIFEST_NAME, Manifest

    path = os.path.join(cache_dir, MANIFEST_NAME)
    if not os.path.isfile(path):
        return CacheCheck("absent", f"no aotc manifest at {path} (nothing fetched, or fetch found no "
                                    "artifact): every graph compiles at start-up")
    try:
        with open(path, "rb") as f:
            manifest = Manifest.from_json(f.read())
    except (OSError, IntegrityError) as exc:
        return CacheCheck("unreadable", f"cannot read {path}: {exc}; treating the cache as unknown")
    environ = launch_environ(os.environ if environ is None else environ)
    ours = fingerprint_inputs(running_entry(vllm_config, manifest, environ), environ)
    digest = digest_of(ours)
    where = f"cache {cache_dir} (entry {manifest.entry}, fingerprint {manifest.fingerprint[:16]})"
    if digest == manifest.fingerprint:
        return CacheCheck("match", f"{where} matches this engine: {len(manifest.files)} files, "
                                   f"{len(manifest.graphs)} graphs", entry=manifest.entry, graphs=manifest.graphs)
    diffs = tuple(describe_diff(ours, manifest.inputs))
    return CacheCheck("mismatch", f"{where} was built for another engine (this one is {digest[:16]}); "
                                  f"{len(diffs)} input(s) differ: {'; '.join(diffs) or 'none (scheme changed?)'}"
                                  " — expect graphs to compile", differences=diffs, entry=manifest.entry,
                      graphs=manifest.graphs)


def log_cache_check(check: CacheCheck) -> None:
    (logger.info if check.status == "match" else logger.warning)("aotc guard: %s", check.line)


# --- after warm-up: count compiles at step boundaries ---------------------------------------------


RESTORED_BY_DYNAMO = ("UncachedCompile",)
_banked: dict[str, int] = {}


def bank_across_clears(met: Any) -> None:
    """Keep counts torch_xla's dynamo bridge erases.

    While it compiles a new graph the bridge calls ``metrics.clear_counters()`` for every FX node and
    puts back only UncachedCompile, so a PersistentCacheMiss would vanish before the step ends. Wrap
    the module function once per process (it chains with any other wrapper, e.g. the build probe's).
    """
    original = met.clear_counters
    if getattr(original, "_aotc_guard_banks", False):
        return

    def clear_and_bank():
        for name in XLA_COUNTERS:
            if name not in RESTORED_BY_DYNAMO:
                _banked[name] = _banked.get(name, 0) + (met.counter_value(name) or 0)
        return original()

    clear_and_bank._aotc_guard_banks = True  # type: ignore[attr-defined]
    met.clear_counters = clear_and_bank


def read_counters() -> dict[str, int]:
    """Process-wide counters; C++/dict reads that never wait for the device."""
    import torch._dynamo.utils as dynamo_utils
    import torch_xla.debug.metrics as met

    values = {name: (met.counter_value(name) or 0) + _banked.get(name, 0) for name in XLA_COUNTERS}
    values[DYNAMO_GRAPHS] = dynamo_utils.counters["stats"]["unique_graphs"]
    return values


def counter_delta(before: dict[str, int], now: dict[str, int]) -> dict[str, int]:
    """What grew; torch_xla's dynamo bridge clears counters mid-graph, so a drop means a reset."""
    return {k: v - before.get(k, 0) if v >= before.get(k, 0) else v for k, v in now.items()}


def uncovered_families(graphs: Any, step: dict[str, Any]) -> list[str]:
    """Families of this step whose padded shape no manifest graph record has."""
    def covered(family: str, keys: tuple[str, ...]) -> bool:
        return any(g.family == family and all(g.shape.get(k) == step.get(k) for k in keys) for g in graphs)

    families = [f for f in STEP_FAMILIES if f != "gather_logprobs" or step.get("logprobs")]
    return [f"{f}[{', '.join(f'{k}={step.get(k)}' for k in STEP_FAMILIES[f])}]"
            for f in families if not covered(f, STEP_FAMILIES[f])]


class Guard:
    """One per worker: the warm-up mark, the last counter reading and the totals since warm-up."""

    def __init__(self, strict: bool, rank: int, graphs: tuple | None = None,
                 counters: Callable[[], dict[str, int]] = read_counters):
        self.strict, self.rank, self.graphs, self._counters = strict, rank, graphs, counters
        self.warm = False
        self.last: dict[str, int] = {}
        self.totals: dict[str, int] = {}

    def warmed_up(self) -> None:
        self.last, self.warm = self._counters(), True
        logger.info("aotc guard: rank %d: warm-up done; counting compiles from here (%s)", self.rank,
                    "strict: a compile raises" if self.strict else "AOTC_GUARD=strict would raise")

    def after_step(self, what: str, describe_step: Callable[[], dict[str, Any]]) -> None:
        if not self.warm:
            return
        now = self._counters()
        new = {k: v for k, v in counter_delta(self.last, now).items() if v}
        self.last = now
        if new:
            self._report(what, new, describe_step())

    def _report(self, what: str, new: dict[str, int], step: dict[str, Any]) -> None:
        for k, v in new.items():
            self.totals[k] = self.totals.get(k, 0) + v
        line = (f"aotc guard: rank {self.rank}: compiled after warm-up in {what} "
                f"({', '.join(f'{k} +{v}' for k, v in sorted(new.items()))}) at step "
                f"{_fmt(step)}; {self._explain(what, new, step)}; since warm-up: {_fmt(self.totals)}")
        if self.strict:
            raise CompiledAfterWarmUp(line + " (AOTC_GUARD=strict)")
        logger.warning("%s", line)


    def _explain(self, what: str, new: dict[str, int], step: dict[str, Any]) -> str:
        if self.graphs is None:
            return "graph family unknown (no manifest)"
        if not new.get("PersistentCacheMiss"):
            return ("the persistent cache holds this graph but it compiled anyway (torch_xla 2.9 cannot load "
                    "cache entries, pytorch/xla#9094)")
        missing = uncovered_families(self.graphs, step) if what == "sample_tokens" else []
        if missing:
            return f"not in the cache; the manifest lacks {', '.join(missing)}"
        return "not in the cache; every family's bucket is in the manifest: a variant capture_model does not trace"


def _fmt(data: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in data.items()) or "-"


def step_shape(runner: Any, scheduled: Any) -> dict[str, Any]:
    """The step's padded shape, computed only when a compile was seen (never on the hot path)."""
    from vllm.v1.worker import tpu_model_runner as tmr

    batch = runner.input_batch
    reqs = len(scheduled.num_scheduled_tokens) if scheduled is not None else batch.num_reqs
    tokens = scheduled.total_num_scheduled_tokens if scheduled is not None else 0
    return {
        "num_reqs": tmr._get_padded_num_reqs_with_upper_limit(max(reqs, 1), runner.max_num_reqs),
        "num_tokens": tmr._get_padded_token_len(runner.num_tokens_paddings, max(tokens, 1)),
        "all_greedy": bool(batch.all_greedy),
        "sampling": "greedy" if batch.all_greedy else "random" if batch.all_random else "greedy+random",
        "logprobs": bool(batch.max_num_logprobs),
        "scheduled_reqs": reqs, "scheduled_tokens": tokens,
    }


# --- wiring into vLLM's TPUWorker -----------------------------------------------------------------


def patch_worker(module: Any) -> None:
    worker = module.TPUWorker
    if getattr(worker, "_aotc_guarded", False):  # general plugins load more than once per process
        return
    worker._aotc_guarded = True
    worker.init_device = _after(worker.init_device, _start_guard)
    worker.compile_or_warm_up_model = _after(worker.compile_or_warm_up_model, _end_warm_up)
    worker.execute_model = _at_step_boundary(worker.execute_model, "execute_model")
    worker.sample_tokens = _at_step_boundary(worker.sample_tokens, "sample_tokens")


def _after(method: Callable, then: Callable[[Any], Any]) -> Callable:
    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        then(self)
        return result

    return wrapped


def _guard_of(worker: Any) -> Guard | None:
    return worker.__dict__.get("_aotc_guard")


def _start_guard(worker: Any) -> None:
    import torch_xla.debug.metrics as met
    import vllm.envs as envs

    bank_across_clears(met)

    try:
        check = check_cache(envs.VLLM_XLA_CACHE_PATH, worker.vllm_config)
    except Exception as exc:  # the guard reports; it never stops a server from starting
        check = CacheCheck("unreadable", f"could not check the cache: {type(exc).__name__}: {exc}")
    if worker.rank == 0:
        log_cache_check(check)
    worker._aotc_guard = Guard(guard_mode() == "strict", worker.rank, check.graphs)


def _end_warm_up(worker: Any) -> None:
    guard = _guard_of(worker)
    if guard is not None:
        guard.warmed_up()


def _at_step_boundary(method: Callable, what: str) -> Callable:
    @functools.wraps(method)
    def wrapped(self, arg, *args, **kwargs):
        # sample_tokens consumes the scheduler output execute_model stored on the runner
        pending = getattr(self.model_runner, "scheduler_output", None)
        result = method(self, arg, *args, **kwargs)
        guard = _guard_of(self)
        if guard is not None:
            scheduled = pending or getattr(self.model_runner, "scheduler_output", None)
            guard.after_step(what, lambda: step_shape(self.model_runner, scheduled))
        return result

    return wrapped


# --- patch a module when it is imported -----------------------------------------------------------


def when_imported(name: str, callback: Callable[[Any], None]) -> None:
    """Run ``callback(module)`` now if ``name`` is imported, else right after its import.

    Importing vLLM's TPU worker here would pull torch_xla into processes that never use it (the API
    server); a one-shot import hook patches it in exactly the processes that load it.
    """
    if name in sys.modules:
        callback(sys.modules[name])
    elif not any(isinstance(f, _PostImportHook) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportHook(name, callback))


class _PostImportHook(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[Any], None]):
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            self.callback(module)

        spec.loader.exec_module = exec_then_patch
        return spec
