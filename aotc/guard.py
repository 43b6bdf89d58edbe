"""The aotc guard: a vLLM general plugin (group ``vllm.general_plugins``) that watches a serving pod.

vLLM calls ``register()`` in every one of its processes whenever aotc is installed (``vllm serve``'s
API server, its engine-core process, aotc's in-process engine), so this module must cost nothing when
``AOTC_GUARD`` is unset: it imports only the standard library at module level, and ``register()`` returns
before touching anything else.

With ``AOTC_GUARD=1`` (or ``strict``) it hooks stock vLLM, the same on every backend:

* ``EngineCore._initialize_kv_caches`` (engine-core process, before the KV cache and warm-up): compare
  ``$VLLM_XLA_CACHE_PATH/manifest.json`` (written by ``aotc fetch``) with this engine's fingerprint and log
  one line: matching, mismatched (naming the differing inputs) or absent. When it returns, warm-up is
  over: the engine is *ready*, and every compile from here on is reported.
* ``Scheduler.update_from_output``: with ``strict``, the requests of a step that compiled finish with
  vLLM's own per-request error (``FinishReason.ERROR``, as for a grammar that fails to compile): the client
  gets an error, the server keeps serving.
* vLLM's ``/metrics`` route: the guard's figures (aotc/guard_metrics.py).

What counts as a compile is the backend's business: the runner's ``RunnerSpec.watcher`` (``module:Class``)
is built with the process's ``GuardSession`` and hooks its stack (torch_xla's counters, JAX's monitoring
events). A runner without a watcher is logged as unwatched, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aotc.runners.watching import StepCompiles, first_patch, when_imported

ENV_GUARD = "AOTC_GUARD"
ENV_ACCELERATOR = "AOTC_ACCELERATOR"
GKE_ACCELERATOR_ENV = "TPU_ACCELERATOR_TYPE"  # set by GKE/TPU VMs in Cloud's names: "v6e-8", "tpu7x-8"
LAUNCH_FLAGS_ENV = "AOTC_GUARD_LAUNCH_FLAGS"
ENGINE_CORE_MODULE = "vllm.v1.engine.core"
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"

ENGINE_ARGS_MODULE = "vllm.engine.arg_utils"
# The engine's arguments as given, recorded where vLLM turns them into its config (``create_engine_config``,
# in the API server or the LLM's process) and inherited by the engine-core process it starts.
ENGINE_ARGS_ENV = "AOTC_GUARD_ENGINE_ARGS"

logger = logging.getLogger("vllm.aotc.guard")  # a child of vLLM's logger: its format, level, handler


OFF_VALUES = ("", "0", "false", "no", "off")
LOG_VALUES = ("1", "true", "yes", "on", "log")
STRICT_VALUES = ("strict",)


def guard_mode(environ: Mapping[str, str] | None = None) -> str | None:
    """None (off), "log" or "strict". A value that is none of the documented ones means log, with a warning
    naming them: log only reports (what clients get is unchanged), so it is the harmless reading of both a
    misspelled "strict" (which still gets its reports, and is told strict is not on) and a misspelled "off"
    (told how to say it); off would silently drop the reports a misspelled "strict" asked for."""
    value = (os.environ if environ is None else environ).get(ENV_GUARD, "").strip().lower()
    if value in OFF_VALUES:
        return None
    if value in STRICT_VALUES:
        return "strict"
    if value not in LOG_VALUES:
        logger.warning("aotc guard: %s=%r is not a valid value (off: 0, false, no, off or unset; log: 1, true, yes, "
                       "on, log; strict: strict): guarding in log mode, which only reports", ENV_GUARD, value)
    return "log"


_session: GuardSession | None = None


def never_raises(what: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, but a failure is one warning: vLLM does not catch a plugin's errors (at load or in an import
    hook), and the guard must never be the reason a server does not start."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            logger.warning("aotc guard: %s failed (%s: %s); serving without it", what, type(exc).__name__, exc)
            return None
    return run


def _register() -> None:
    global _session
    if _session is not None:
        return
    mode = guard_mode()
    if mode is None:
        return
    from aotc import guard_metrics

    remember_launch_flags()
    guard_metrics.metrics_dir()  # created by the first process, inherited by the ones vLLM starts
    _session = GuardSession(mode, running_runner())
    when_imported(ENGINE_ARGS_MODULE, never_raises("recording the engine arguments", patch_engine_args))
    when_imported(ENGINE_CORE_MODULE, never_raises("hooking the engine core",
                                                   functools.partial(patch_engine_core, _session)))
    when_imported(SCHEDULER_MODULE, never_raises("hooking the scheduler", functools.partial(patch_scheduler, _session)))
    when_imported(guard_metrics.VLLM_METRICS_ROUTE, never_raises("joining /metrics", guard_metrics.serve_on_vllm_metrics))


# vLLM's general-plugin hook; may run several times per process
register = never_raises("starting the guard", _register)


def running_runner() -> Any:
    """The registered runner whose whole stack is installed in this interpreter (None: none or several).

    Each runner's stack lives in its own venv (requirements/*.lock), so its distributions tell them apart
    without importing anything.
    """
    from aotc.runners.spec import package_version
    from aotc.runners.spec import registered

    installed = [spec for spec in registered().values() if all(package_version(p) for p in spec.packages)]
    return installed[0] if len(installed) == 1 else None


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
    from aotc.runners.flags import FLAG_ENV_VARS

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


def running_entry(vllm_config: Any, manifest: Any = None, environ: Mapping[str, str] | None = None, *,
                  runner: str, device: str):
    """The matrix Entry this engine is: its VllmConfig and the arguments it was given (what the pod really
    runs). Every input comes from this engine but the accelerator where the pod names none (the CPU twin)."""
    from aotc.accelerators import from_cloud_name
    from aotc.matrix import Entry

    environ = os.environ if environ is None else environ
    published = manifest.inputs if manifest is not None else {}
    model_cfg, model = vllm_config.model_config, vllm_config.model_config.model
    record = recorded_engine_args(environ)
    return Entry(
        name=manifest.entry if manifest is not None else "running",
        model_name=os.path.basename(model.rstrip("/")), model=model,
        revision=model_cfg.revision or "main",  # vLLM's None is the hub's default branch, the matrix's "main"
        runner=runner,
        device=device,
        accelerator=from_cloud_name(environ.get(ENV_ACCELERATOR) or environ.get(GKE_ACCELERATOR_ENV)
                                    or published.get("accelerator") or "unknown"),
        # as asked for ("auto" included): vLLM resolves it before a worker exists
        dtype=str(record["given"].get("dtype", "auto") if record else model_cfg.dtype).removeprefix("torch."),
        max_model_len=model_cfg.max_model_len,
        max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
        max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
        tensor_parallel_size=vllm_config.parallel_config.tensor_parallel_size,
        engine=running_engine_args(record, published.get("engine") or {}, model),
        model_path=os.path.abspath(model) if os.path.isdir(model) else None,
    )


# --- the engine's arguments as given ------------------------------------------------------------------


def patch_engine_args(module: Any) -> None:
    """Record the arguments an engine is created with: vLLM calls ``create_engine_config`` once per engine,
    before it starts the engine core, which inherits the record through the environment (as the launch flags).
    Recorded on entry, before vLLM fills in what it derives (tokenizer, prefix caching, ...)."""
    cls = module.EngineArgs
    if not first_patch(cls):
        return
    create = cls.create_engine_config

    @functools.wraps(create)
    def create_engine_config(self, *args, **kwargs):
        try:
            os.environ[ENGINE_ARGS_ENV] = json.dumps({"class": f"{type(self).__module__}:{type(self).__qualname__}",
                                                      "given": given_engine_args(self)})
        except Exception as exc:  # the guard never stops a server: the check will say nothing was recorded
            os.environ.pop(ENGINE_ARGS_ENV, None)
            logger.warning("aotc guard: cannot record the engine's arguments: %s: %s", type(exc).__name__, exc)
        return create(self, *args, **kwargs)

    cls.create_engine_config = create_engine_config


def given_engine_args(args: Any) -> dict[str, Any]:
    """The fields of an EngineArgs that differ from vLLM's defaults, as JSON values. vLLM has two sets of
    defaults, the dataclass's (``LLM(...)``) and ``vllm serve``'s parser's (e.g. vLLM 0.32's
    ``mm_device_do_normalize``: True and None): a value is given only when it differs from both, so an engine
    and the manifest's arguments compare alike whichever way each was made."""
    cli = _cli_defaults()
    given = {}
    for field in dataclasses.fields(args):
        value = _plain(getattr(args, field.name))
        if value != _plain(_default(field)) and value != cli.get(field.name, _UNSET):
            given[field.name] = value
    return given


@functools.cache
def _cli_defaults() -> dict[str, Any]:
    """``vllm serve``'s defaults, from its own parser (aotc/runners/serve_args.py); {} where it cannot load."""
    try:
        from aotc.runners.serve_args import serve_parser

        return {key: _plain(value) for key, value in vars(serve_parser().parse_args([])).items()}
    except Exception:  # a report never stops a server: then the dataclass's defaults alone count
        return {}


def recorded_engine_args(environ: Mapping[str, str]) -> dict[str, Any] | None:
    try:
        record = json.loads(environ.get(ENGINE_ARGS_ENV) or "null")
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("given"), dict) else None


def running_engine_args(record: dict[str, Any] | None, published: dict[str, Any], model: str) -> dict[str, Any]:
    """This engine's arguments in the manifest's terms: an argument counts as the manifest's value only where
    vLLM's own EngineArgs, given the manifest's arguments, holds what this engine was given; else as given, or
    absent where it was not (vLLM's default). Every argument the engine reads is compared, so the next one
    cannot slip by. Front-end arguments (not EngineArgs fields: chat templates, tool parsers) never reach the
    engine core and change no graph: they stand as published. No record (an engine not made through
    ``create_engine_config``): nothing can be verified, and the check says so."""
    from aotc.engine_args import OWN_KEYS
    from aotc.runners.kv_sizing import OVERRIDE

    if record is None:
        return {"<engine arguments>": "not recorded (no EngineArgs.create_engine_config in this engine's start)"}
    cls = _engine_args_class(record["class"])
    fields = {field.name for field in dataclasses.fields(cls)}
    ours = {key: value for key, value in published.items() if key not in fields}
    theirs = _published_as_given(cls, {key: value for key, value in published.items() if key in fields}, model)
    given = {key: value for key, value in record["given"].items() if not _aotc_engine_arg(key, value)}
    compared = (given.keys() | theirs.keys() | published.keys() & fields) - OWN_KEYS - {OVERRIDE}
    for key in sorted(compared):
        if given.get(key, _UNSET) == theirs.get(key, _UNSET):
            if key in published:
                ours[key] = published[key]
        elif key in given:
            ours[key] = given[key]
    return ours


_UNSET = object()


def _aotc_engine_arg(key: str, value: Any) -> bool:
    """An argument aotc's own engines add beyond the matrix's: an in-process LLM's token-id input, the CPU twin's
    worker (aotc/runners/vllm_engine.py, the runners' engine.py). The build's graphs are made with them and
    the fingerprint hashes neither (the twin's worker follows from ``device``), so neither is a difference."""
    return key == "skip_tokenizer_init" or key == "worker_cls" and str(value).startswith("aotc.runners.")


def _published_as_given(cls: Any, published: dict[str, Any], model: str) -> dict[str, Any]:
    """``given_engine_args`` of an EngineArgs made from the manifest's arguments (vLLM normalizes them as it
    normalized this engine's); {} when vLLM refuses them (then every one differs)."""
    try:
        return given_engine_args(cls(model=model, **published))
    except Exception:  # the manifest's arguments, not this engine's: a refusal is a difference, not a crash
        return {}


def _engine_args_class(name: str) -> Any:
    import importlib

    module, _, qualname = name.partition(":")
    return functools.reduce(getattr, qualname.split("."), importlib.import_module(module))


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else None


def _plain(value: Any) -> Any:
    """A JSON value for an engine argument: config dataclasses as their fields that differ from the type's
    defaults (what a matrix's mapping says; none: None, as unset), enums as their values, anything else as its
    repr."""
    if value is None or isinstance(value, (bool, int, float, str)) and not isinstance(value, enum.Enum):
        return value
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _changed_fields(value) or None  # a config at its defaults is no setting at all
    return repr(value)


def _changed_fields(config: Any) -> dict[str, Any]:
    try:
        base = type(config)()
    except Exception:  # a config with required fields: all of them
        base = None
    return {field.name: _plain(getattr(config, field.name)) for field in dataclasses.fields(config)
            if base is None or _plain(getattr(config, field.name)) != _plain(getattr(base, field.name))}


def check_cache(cache_dir: str, vllm_config: Any, environ: Mapping[str, str] | None = None, *,
                runner: str, device: str, live_flags: bool = False) -> CacheCheck:
    """``live_flags``: the runner's compiler hashes this process's XLA_FLAGS / LIBTPU_INIT_ARGS as they are
    now, its stack's own additions included (JAX); otherwise the flags as the pod launched it count."""
    from aotc.errors import IntegrityError
    from aotc.fingerprint import describe_diff, digest_of, fingerprint_inputs
    from aotc.runners.flags import xla_flags
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
    live = dict(os.environ if environ is None else environ)
    environ = launch_environ(live)
    # the KV block count this engine was told (None: vLLM sizes it from memory), never one sized here again
    ours = fingerprint_inputs(running_entry(vllm_config, manifest, environ, runner=runner, device=device), environ,
                              kv_blocks=vllm_config.cache_config.num_gpu_blocks_override)
    if live_flags:  # what the compiler hashes here: the stack's additions as this process holds them now
        ours["xla_flags"] = xla_flags(live)
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


class GuardSession:
    """One per process: the runner, its watcher, the cache check, the ready mark and the figures."""

    def __init__(self, mode: str, runner: Any):
        from aotc.guard_metrics import Figures

        self.mode, self.runner = mode, runner
        self.strict = mode == "strict"
        self.check: CacheCheck | None = None
        self.ready = False
        self.figures = Figures(runner=runner.name if runner else "unknown", mode=mode)
        self._failing: set[str] = set()
        self._lock = threading.Lock()
        self.watcher = runner.watcher(self) if runner is not None else None
        self.figures.watched = self.watcher is not None

    @property
    def graphs(self) -> tuple | None:
        return self.check.graphs if self.check else None

    # -- engine core ------------------------------------------------------------------------------

    def start(self, vllm_config: Any, cache_dir: str | None) -> None:
        """Before the KV cache and warm-up: the cache check, and say what is (not) watched."""
        if self.runner is None:
            logger.warning("aotc guard: cannot tell which aotc runner this is (none or several stacks "
                           "installed): no cache check, compiles unwatched")
        elif self.watcher is None:
            logger.warning("aotc guard: runner %s has no watcher: compiles after ready are NOT counted "
                           "(unwatched)", self.runner.name)
        if self.runner is not None:
            try:
                check = check_cache(cache_dir or "", vllm_config, runner=self.runner.name,
                                    device=self.watcher.device if self.watcher else "tpu",
                                    live_flags=bool(self.watcher and self.watcher.live_flags))
            except Exception as exc:  # the guard reports; it never stops a server from starting
                check = CacheCheck("unreadable", f"could not check the cache: {type(exc).__name__}: {exc}")
            log_cache_check(check)
            self.check = check
            self.figures.cache, self.figures.entry = check.status, check.entry or ""
        self.publish()

    def mark_ready(self) -> None:
        if self.watcher is not None:
            self.watcher.ready()
        self.ready = self.figures.ready = True
        logger.info("aotc guard: ready after %d compile(s) at start-up (%d cache hit(s)); counting compiles from "
                    "here (%s)", self.figures.compiles_at_startup, self.figures.cache_hits,
                    "strict: a compile fails its requests" if self.strict else "AOTC_GUARD=strict would fail them")
        self.publish()

    # -- what watchers call -----------------------------------------------------------------------

    def count(self, *, compiles: int = 0, hits: int = 0, misses: int = 0) -> None:
        """Cache traffic and compiles outside a reported step (start-up); published at ready."""
        f = self.figures
        f.cache_hits, f.cache_misses = f.cache_hits + hits, f.cache_misses + misses
        if not self.ready:
            f.compiles_at_startup += compiles
        elif hits or misses:
            self.publish()

    def compiled(self, event: StepCompiles) -> None:
        """A step after ready compiled: log it, count it, and with strict fail the step's requests."""
        f = self.figures
        f.compiles_after_ready[event.family] = f.compiles_after_ready.get(event.family, 0) + event.compiles
        since = sum(f.compiles_after_ready.values())
        functions = f"; compiled {', '.join(event.functions)}" if event.functions else ""
        line = (f"aotc guard: compiled after ready in {event.where} "
                f"({', '.join(f'{k} +{v}' for k, v in sorted(event.evidence.items()))}) at step {_fmt(event.step)}"
                f"{functions}; {event.explanation}; since ready: {since} compile(s)")
        logger.warning("%s", line)
        if self.strict and event.request_ids:
            with self._lock:
                self._failing.update(event.request_ids)
            logger.error("aotc guard: AOTC_GUARD=strict: failing request(s) %s: their step compiled a graph "
                         "after ready", ", ".join(event.request_ids))
        self.publish()

    def take_failing(self) -> set[str]:
        with self._lock:
            failing, self._failing = self._failing, set()
        return failing

    def publish(self) -> None:
        from aotc import guard_metrics

        try:
            guard_metrics.publish(self.figures)
        except OSError as exc:  # metrics are a report; never a reason to stop serving
            logger.warning("aotc guard: cannot write metrics snapshot: %s", exc)


def _fmt(data: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in data.items()) or "-"


# --- wiring into stock vLLM -----------------------------------------------------------------------


def patch_engine_core(session: GuardSession, module: Any) -> None:
    """Check the cache before the KV cache and warm-up; ready when ``_initialize_kv_caches`` returns.

    The engine-core process loads general plugins inside ``EngineCore.__init__``, so only methods it calls
    later can be hooked there; this one runs after the model is loaded, before the first warm-up compile
    of the KV-cache-shaped graphs, in vLLM 0.13 and vLLM-TPU 0.32 alike.
    """
    core = module.EngineCore
    if not first_patch(core):
        return
    initialize = core._initialize_kv_caches

    @functools.wraps(initialize)
    def initialize_kv_caches(self, vllm_config, *args, **kwargs):
        import vllm.envs as envs

        session.start(vllm_config, envs.VLLM_XLA_CACHE_PATH)
        result = initialize(self, vllm_config, *args, **kwargs)
        session.mark_ready()
        return result

    core._initialize_kv_caches = initialize_kv_caches


def patch_scheduler(session: GuardSession, module: Any) -> None:
    """Fail what strict marked through vLLM's own per-request error path; the engine keeps serving."""
    scheduler = module.Scheduler
    if not first_patch(scheduler):
        return
    update = scheduler.update_from_output

    @functools.wraps(update)
    def update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs):
        outputs = update(self, scheduler_output, model_runner_output, *args, **kwargs)
        if session._failing:  # a set read: nothing else on the hot path
            fail_requests(self, outputs, session.take_failing(), session)
        return outputs

    scheduler.update_from_output = update_from_output


def fail_requests(scheduler: Any, outputs: dict, request_ids: set[str], session: GuardSession) -> None:
    """Finish ``request_ids`` with FinishReason.ERROR, as the scheduler does for a failed grammar compile."""
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
    from vllm.v1.request import RequestStatus

    for request_id in sorted(request_ids):
        request = scheduler.requests.get(request_id)
        if request is None or request.is_finished():
            continue  # it finished in the step that compiled: the client already has its answer
        scheduler.finish_requests([request_id], RequestStatus.FINISHED_ERROR)
        batch = outputs.setdefault(request.client_index, EngineCoreOutputs())
        batch.outputs.append(EngineCoreOutput(request_id=request_id, new_token_ids=[],
                                              finish_reason=FinishReason.ERROR))
        if batch.finished_requests is not None:
            batch.finished_requests.add(request_id)
        session.figures.requests_failed += 1
    session.publish()
