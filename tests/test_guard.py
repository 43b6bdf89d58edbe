"""The serving guard (aotc/guard.py): cache check, compile counting, and an end-to-end run on the CPU twin."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest

from aotc import guard, guard_metrics
from aotc.fingerprint import diff_inputs, entry_kv_blocks, fingerprint_entry, flatten, pin_kv
from aotc.manifest import GraphRecord, Manifest
from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from aotc.runners.spec import RunnerSpec, load_runner
from aotc.runners import watching
from aotc.runners.vllm_tpu import watcher

from .conftest import CONFIGS, REPO
from .helpers.guard_engine import OUTCOME

DEMO_ENTRY = "tiny-llama--len128-seqs8-tok64-tp1"
TWIN = {"runner": "vllm-tpu", "device": "cpu"}  # what the vllm-tpu watcher reports on the CPU twin
ENV = {"AOTC_CPU_TWIN": "1", "XLA_FLAGS": "--xla_dump_to=/tmp/x", "VLLM_TPU_BUCKET_PADDING_GAP": "0"}


def pinned_kv(entry) -> int:
    return entry_kv_blocks(entry)


def demo_entry():
    return load_matrix(CONFIGS / "demo.yaml").entry(DEMO_ENTRY)


def vllm_config(entry, **overrides):
    """The slice of a VllmConfig the guard reads, shaped like vLLM's."""
    values = {"max_num_seqs": entry.max_num_seqs, **overrides}
    return SimpleNamespace(
        model_config=SimpleNamespace(model=entry.model_path or entry.model, revision=None, dtype="torch.bfloat16",
                                     max_model_len=entry.max_model_len, quantization=None, max_logprobs=20),
        scheduler_config=SimpleNamespace(max_num_seqs=values["max_num_seqs"], disable_chunked_mm_input=False,
                                         max_num_batched_tokens=entry.max_num_batched_tokens),
        parallel_config=SimpleNamespace(tensor_parallel_size=entry.tensor_parallel_size),
        cache_config=SimpleNamespace(cache_dtype="auto", enable_prefix_caching=True, block_size=128,
                                     num_gpu_blocks_override=values.get("kv_blocks", pinned_kv(entry))),
        lora_config=None,
    )


def launched(entry, environ):
    """``environ`` as the guard's ``create_engine_config`` hook leaves it for an engine given the entry's
    arguments (vLLM's own EngineArgs, as ``vllm serve`` makes it)."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=entry.model_path or entry.model, dtype=entry.dtype, **entry.engine)
    record = {"class": "vllm.engine.arg_utils:EngineArgs", "given": guard.given_engine_args(args)}
    return {**environ, guard.ENGINE_ARGS_ENV: json.dumps(record)}


def write_manifest(cache_dir, entry, environ, graphs=()):
    fp = fingerprint_entry(entry, environ)
    Manifest(entry=entry.name, fingerprint=fp.digest, inputs=fp.inputs, created="2025-01-01T00:00:00+00:00",
             aotc_version="0.1.0", runner=entry.runner, device=entry.device, graphs=tuple(graphs)).save(cache_dir)
    return fp


# --- start-up check -------------------------------------------------------------------------------


def test_matching_manifest(tmp_path):
    entry = demo_entry()
    write_manifest(tmp_path, entry, ENV)
    check = guard.check_cache(str(tmp_path), vllm_config(entry), launched(entry, ENV), **TWIN)
    assert check.status == "match", check.line
    assert DEMO_ENTRY in check.line


def test_mismatch_names_the_differing_inputs(tmp_path):
    entry = demo_entry()
    write_manifest(tmp_path, replace(entry, max_num_seqs=16, engine={"block_size": 16, "num_gpu_blocks_override": 33}),
                   ENV)
    pod = launched(entry, {**ENV, "VLLM_TPU_BUCKET_PADDING_GAP": "64"})
    check = guard.check_cache(str(tmp_path), vllm_config(entry), pod, **TWIN)
    assert check.status == "mismatch"
    # the published entry pinned another KV block count than the pod's (its stack's sizing), and was built with a
    # block size the pod was not given
    assert [d.split(":")[0] for d in check.differences] == ["engine", "engine.block_size",
                                                            "env.VLLM_TPU_BUCKET_PADDING_GAP", "kv_blocks",
                                                            "max_num_seqs"]
    assert "max_num_seqs: here 8, published 16" in check.line


def test_a_pod_sized_differently_is_a_mismatch_naming_kv_blocks(tmp_path):
    entry = demo_entry()
    write_manifest(tmp_path, entry, ENV)
    for pod_kv in (pinned_kv(entry) * 2, None):  # another pinned size, or vLLM sizing it from memory
        check = guard.check_cache(str(tmp_path), vllm_config(entry, kv_blocks=pod_kv), launched(entry, ENV), **TWIN)
        assert check.status == "mismatch" and check.differences == (
            f"kv_blocks: here {pod_kv!r}, published {pinned_kv(entry)!r}",), check.line


@pytest.mark.needs_jax
def test_jax_flags_are_checked_as_the_engine_core_hashes_them(tmp_path):
    # a pinned KV block count: this is about flags, not the stack's KV sizing
    entry = replace(load_matrix(CONFIGS / "demo-jax.yaml").entries[0], engine={"num_gpu_blocks_override": 64})
    launch = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    write_manifest(tmp_path, entry, launch)
    implied = load_runner("tpu-inference").stack_flags

    def engine_core(imports):  # tpu_inference/env_override.py prepends its flags at each import
        return {var: " ".join([*implied.get(var, ())] * imports + launch.get(var, "").split()).strip()
                for var in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")}

    jax_twin = {"runner": "tpu-inference", "device": "cpu", "live_flags": True}
    # an engine core as aotc's plugin leaves it: the stack's flags once, as the build fingerprinted
    assert guard.check_cache(str(tmp_path), vllm_config(entry), launched(entry, engine_core(1)),
                             **jax_twin).status == "match"
    # one the plugin did not collapse (the API server's copy and its own): JAX hashes both, so the keys differ
    check = guard.check_cache(str(tmp_path), vllm_config(entry), launched(entry, engine_core(2)), **jax_twin)
    assert check.status == "mismatch" and [d.split(":")[0] for d in check.differences] == ["xla_flags"]


def test_absent_and_unreadable_manifests(tmp_path):
    entry = demo_entry()
    assert guard.check_cache(str(tmp_path / "nothing"), vllm_config(entry), ENV, **TWIN).status == "absent"
    (tmp_path / "manifest.json").write_text("{not json")
    assert guard.check_cache(str(tmp_path), vllm_config(entry), ENV, **TWIN).status == "unreadable"


def test_flags_torch_xla_appends_after_launch_do_not_count(tmp_path):
    entry = demo_entry()
    write_manifest(tmp_path, entry, ENV)
    environ = launched(entry, {**ENV, guard.LAUNCH_FLAGS_ENV: guard.launch_flags_record(ENV)})
    environ["XLA_FLAGS"] += " --xla_cpu_enable_fast_math=false"  # what `import torch_xla` does
    environ["LIBTPU_INIT_ARGS"] = "--xla_jf_conv_input_fusion=False"  # what TPUWorker.init_device does
    assert guard.check_cache(str(tmp_path), vllm_config(entry), environ, **TWIN).status == "match"


def test_engine_args_count_as_published_only_where_vllm_reads_them_alike():
    entry = replace(demo_entry(), engine={"block_size": 16, "num_gpu_blocks_override": 65})
    manifest = SimpleNamespace(entry=entry.name, inputs={"engine": {"block_size": 16, "kv_cache_dtype": "fp8",
                                                                    "chat_template": "t.jinja"}})
    running = guard.running_entry(vllm_config(entry), manifest, launched(entry, {}), **TWIN)
    # as given (vLLM's TPU platform overwrites block_size in the config), kv_cache_dtype not given (vLLM's default);
    # a front-end argument stands as published
    assert running.engine == {"block_size": 16, "chat_template": "t.jinja"}
    # an engine made without create_engine_config: nothing to verify, and the check says so
    assert list(guard.running_entry(vllm_config(entry), manifest, {}, **TWIN).engine) == ["<engine arguments>"]


def test_an_engine_from_vllm_serves_parser_is_given_what_an_llm_with_the_same_arguments_is():
    """vllm serve's parser and EngineArgs' dataclass disagree on some defaults (enable_lora None / False, ...):
    the same arguments must compare alike whichever way the engine was made."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from aotc.engine_args import cli_flags
    from aotc.runners.serve_args import serve_parser

    model, engine = demo_entry().model_path, {"block_size": 16, **EXTRAS}
    served = AsyncEngineArgs.from_cli_args(serve_parser().parse_args(["--model", model, *cli_flags(engine)]))
    assert guard.given_engine_args(served) == guard.given_engine_args(AsyncEngineArgs(model=model, **engine))


# the published artifact's extra engine arguments: the async scheduling and hf_overrides (speculative
# decoding is refused on vllm-tpu)
EXTRAS = {"async_scheduling": True, "hf_overrides": {"aotc_note": 1}}


def start_verdicts(tmp_path, name, engine, caches, env):
    """tests/helpers/guard_verdict.py on the demo's model with ``engine``: the plugin's verdict per cache."""
    entry = demo_entry()
    request = tmp_path / f"{name}.json"
    request.write_text(json.dumps({"caches": [str(c) for c in caches], "args": {
        "model": entry.model_path, "dtype": entry.dtype, "max_model_len": entry.max_model_len,
        "max_num_seqs": entry.max_num_seqs, "max_num_batched_tokens": entry.max_num_batched_tokens,
        "load_format": "dummy", **engine}}))
    return subprocess.Popen([sys.executable, "-m", "tests.helpers.guard_verdict", str(request)], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def verdicts_of(proc):
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-4000:]
    [line] = [line for line in out.splitlines() if line.startswith(OUTCOME)]
    return [(v["status"], sorted(d.split(":")[0] for d in v["differences"])) for v in json.loads(line[len(OUTCOME):])]


@pytest.mark.full
def test_the_start_up_verdict_compares_every_engine_argument_the_artifact_was_built_with(tmp_path):
    """The plugin loaded by vLLM's own EngineArgs, the VllmConfig its create_engine_config makes (CPU twin)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TPU_ACCELERATOR_TYPE", "AOTC_ACCELERATOR")}
    env.update(AOTC_GUARD="1", AOTC_CPU_TWIN="1", PJRT_DEVICE="CPU", VLLM_HOST_IP="127.0.0.1")
    pinned = {"num_gpu_blocks_override": 65}
    with_extras, plain = tmp_path / "with-extras", tmp_path / "plain"
    with_extras.mkdir(), plain.mkdir()
    built = [write_manifest(with_extras, replace(demo_entry(), engine={**pinned, **EXTRAS}), env),
             write_manifest(plain, replace(demo_entry(), engine=pinned), env)]
    servers = [start_verdicts(tmp_path, name, engine, (with_extras, plain), env)
               for name, engine in (("plain", pinned), ("extras", {**pinned, **EXTRAS}))]
    named = diff_inputs(built[0].inputs, built[1].inputs)
    assert {f"engine.{key}" for key in flatten(EXTRAS)} <= set(named)
    # a server given none of them, then one given both: each matches only the artifact built as it runs
    assert verdicts_of(servers[0]) == [("mismatch", named), ("match", [])]
    assert verdicts_of(servers[1]) == [("match", []), ("mismatch", named)]


@pytest.mark.parametrize("value, mode", [("", None), ("0", None), ("off", None), ("1", "log"), ("STRICT", "strict")])
def test_guard_mode(value, mode):
    assert guard.guard_mode({"AOTC_GUARD": value}) == mode


def test_import_and_register_are_free_when_unset():
    code = ("import sys, aotc.guard as g, aotc.runners.watching as w; g.register(); "
            "print(sorted(m for m in ('torch', 'torch_xla', 'vllm', 'yaml', 'pydantic', 'aotc.matrix') "
            "if m in sys.modules), any(isinstance(f, w._PostImportHook) for f in sys.meta_path))")
    env = {k: v for k, v in os.environ.items() if k != "AOTC_GUARD"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["[]", "False"]


def test_steps_are_patched_once_when_the_worker_module_is_imported(tmp_path):
    package = tmp_path / "fakevllm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "worker.py").write_text("class TPUWorker:\n" + "".join(
        f"    def {m}(self, *a): return '{m}'\n" for m in ("execute_model", "sample_tokens")))
    code = ("import aotc.runners.watching as g; seen = []\n"
            "patch = lambda m: g.patch_steps(m.TPUWorker, lambda w, what, s: seen.append((what, s)))\n"
            "g.when_imported('fakevllm.worker', patch); g.when_imported('fakevllm.worker', patch)\n"
            "from fakevllm.worker import TPUWorker as W; w = W(); w.execute_model('sched'); w.sample_tokens(None)\n"
            "print(W._aotc_guarded, W.execute_model.__wrapped__.__name__, "
            "hasattr(W.execute_model.__wrapped__, '__wrapped__'), seen)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    # wrapped once, not twice; sample_tokens finishes the step execute_model scheduled
    assert out.stdout.split(" ", 3) == ["True", "execute_model", "False",
                                        "[('execute_model', 'sched'), ('sample_tokens', 'sched')]\n"]


# --- after ready: the vllm-tpu watcher and the session it reports to ------------------------------


class FakeCounters:
    def __init__(self):
        self.values = {"UncachedCompile": 10, "PersistentCacheMiss": 3, "PersistentCacheHit": 0, "DynamoGraphs": 5}

    def __call__(self):
        return dict(self.values)


STEP = {"num_reqs": 16, "num_tokens": 32, "all_greedy": False, "logprobs": False}
GRAPHS = (GraphRecord("backbone", {"num_tokens": 32, "num_reqs": 8, "num_blocks": 8}),
          GraphRecord("select_hidden_states", {"num_tokens": 32, "num_reqs": 8}),
          GraphRecord("compute_logits", {"num_reqs": 16}),
          GraphRecord("sample_from_logits", {"num_reqs": 16, "all_greedy": True}))


def test_uncovered_families_names_what_the_manifest_lacks():
    assert watching.uncovered_families(GRAPHS, STEP, watcher.step_families(STEP)) == [
        "select_hidden_states[num_tokens=32, num_reqs=16]", "sample_from_logits[num_reqs=16, all_greedy=False]"]
    with_logprobs = {**STEP, "logprobs": True}
    assert "gather_logprobs[num_reqs=16]" in watching.uncovered_families(GRAPHS, with_logprobs,
                                                                      watcher.step_families(with_logprobs))


def test_counter_delta_survives_dynamo_resets():
    assert watching.counter_delta({"a": 5, "b": 2}, {"a": 7, "b": 1}) == {"a": 2, "b": 1}


def test_cache_misses_survive_the_dynamo_bridge_clearing_counters(monkeypatch):
    raw = {"UncachedCompile": 0, "PersistentCacheMiss": 0, "PersistentCacheHit": 0}
    met = SimpleNamespace(counter_value=raw.get, clear_counters=lambda: raw.update(PersistentCacheMiss=0))
    monkeypatch.setattr(watcher, "_banked", {})
    watcher.bank_across_clears(met)
    watcher.bank_across_clears(met)  # once per process, however often a worker starts
    raw.update(PersistentCacheMiss=1, UncachedCompile=1)
    met.clear_counters()
    met.clear_counters()
    assert watcher._banked == {"PersistentCacheMiss": 1, "PersistentCacheHit": 0}  # UncachedCompile: restored


def session_with_vllm_tpu_watcher(mode, monkeypatch, tmp_path):
    """A real session and watcher; only torch_xla's counters and the step's shape are stand-ins."""
    monkeypatch.setenv(guard_metrics.METRICS_DIR_ENV, str(tmp_path))
    session = guard.GuardSession(mode, None)
    counters = FakeCounters()
    session.watcher = watcher.Watcher(session, counters=counters)
    session.check = guard.CacheCheck("match", "", graphs=GRAPHS)
    monkeypatch.setattr(watcher, "step_shape", lambda runner, scheduled: STEP)
    return session, counters


def listen(caplog):
    # vLLM's logging config stops "vllm.*" records from reaching the root logger once vllm is
    # imported (as it is when other tests ran first), so listen on the guard's logger itself
    logger = logging.getLogger("vllm.aotc.guard")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="vllm.aotc.guard")
    return lambda: logger.removeHandler(caplog.handler)


def test_watcher_counts_only_after_ready_and_logs_each_compile(caplog, monkeypatch, tmp_path):
    session, counters = session_with_vllm_tpu_watcher("log", monkeypatch, tmp_path)
    worker, scheduled = SimpleNamespace(model_runner=None), SimpleNamespace(num_scheduled_tokens={"r1": 3})
    counters.values["UncachedCompile"] += 5  # warm-up compiles are expected
    session.watcher.on_step(worker, "sample_tokens", scheduled)
    session.mark_ready()
    assert session.figures.compiles_at_startup == 15
    session.watcher.on_step(worker, "execute_model", scheduled)  # a quiet step
    counters.values.update(UncachedCompile=16, PersistentCacheMiss=4)
    done = listen(caplog)
    try:
        session.watcher.on_step(worker, "sample_tokens", scheduled)
    finally:
        done()
    assert session.figures.compiles_after_ready == {"select_hidden_states": 1}
    [line] = {r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING}  # root may see it too
    assert "compiled after ready in sample_tokens (PersistentCacheMiss +1, UncachedCompile +1)" in line
    assert "sample_from_logits[num_reqs=16, all_greedy=False]" in line
    assert session.take_failing() == set()  # log mode fails nothing
    [snapshot] = guard_metrics.read_snapshots(str(tmp_path))
    assert snapshot.compiles_after_ready == {"select_hidden_states": 1} and snapshot.ready


def test_strict_marks_the_steps_requests_to_fail(monkeypatch, tmp_path):
    session, counters = session_with_vllm_tpu_watcher("strict", monkeypatch, tmp_path)
    session.mark_ready()
    counters.values["DynamoGraphs"] += 1
    session.watcher.on_step(SimpleNamespace(model_runner=None), "sample_tokens",
                            SimpleNamespace(num_scheduled_tokens={"r1": 1, "r2": 1}))
    assert session.take_failing() == {"r1", "r2"}
    assert session.take_failing() == set()


@dataclasses.dataclass(frozen=True)
class UnwatchedRunner(RunnerSpec):
    """A runner whose stack has no compile counter: ``RunnerSpec.watcher``'s default."""

    @property
    def planner(self):
        return load_runner("vllm-tpu").planner


def test_a_runner_without_a_watcher_says_so(caplog, monkeypatch, tmp_path):
    monkeypatch.setenv(guard_metrics.METRICS_DIR_ENV, str(tmp_path))
    spec = UnwatchedRunner(name="vllm-tpu", module="m", packages=())
    session = guard.GuardSession("log", spec)
    done = listen(caplog)
    try:
        session.start(vllm_config(demo_entry()), str(tmp_path / "cache"))
    finally:
        done()
    assert any("runner vllm-tpu has no watcher" in r.getMessage() and "unwatched" in r.getMessage()
               for r in caplog.records)
    [snapshot] = guard_metrics.read_snapshots(str(tmp_path))
    assert (snapshot.watched, snapshot.cache) == (False, "absent")


def test_each_stack_finds_its_own_runner():
    # the core's venv holds only the torch_xla stack; the JAX venv's interpreter would name tpu-inference
    assert guard.running_runner().name == "vllm-tpu"


def test_metrics_collector_renders_the_engines_figures(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    guard_metrics.publish(guard_metrics.Figures(runner="tpu-inference", watched=True, cache="match", entry="e",
                                                ready=True, compiles_at_startup=3, cache_hits=40,
                                                compiles_after_ready={"unplanned": 2}), str(tmp_path))
    (tmp_path / "aotc-guard-999999999.json").write_text("{}")  # a dead process's snapshot is skipped
    registry = CollectorRegistry()
    registry.register(guard_metrics.GuardCollector(str(tmp_path)))
    text = generate_latest(registry).decode()
    for sample in ('aotc_compiles_after_ready_total{family="unplanned"} 2.0', "aotc_compiles_at_startup_total 3.0",
                   "aotc_cache_match 1.0", "aotc_cache_hits_total 40.0", "aotc_ready 1.0",
                   'aotc_guard_info{cache="match",entry="e",mode="log",runner="tpu-inference",watched="true"} 1.0'):
        assert sample in text, text


# --- end to end on the CPU twin -------------------------------------------------------------------


def start_twin(tmp_path, name, manifest_entry, mode):
    """Start the engine in a subprocess on a cache dir holding only a manifest; returns (proc, paths)."""
    cache = tmp_path / name
    cache.mkdir()
    entry = demo_entry()
    env = {k: v for k, v in os.environ.items() if k not in ("TPU_ACCELERATOR_TYPE", "AOTC_ACCELERATOR")}
    env.update(AOTC_GUARD=mode, AOTC_CPU_TWIN="1")
    write_manifest(cache, manifest_entry, env, graphs=[GraphRecord(g.family, g.shape_dict)
                                                     for g in plan_entry(manifest_entry).graphs])
    entry_json = tmp_path / f"{name}.json"
    # the engine pinned as a build and a pod pin it (the KV block count is a shape in its graphs)
    entry_json.write_text(json.dumps({**pin_kv(entry).to_dict(), "model": entry.model_path}))
    with open(tmp_path / f"{name}.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.guard_engine", str(entry_json), str(cache)],
                                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    return proc, tmp_path / f"{name}.log"


def finish(proc, log_path):
    proc.wait(timeout=900)
    lines = log_path.read_text().splitlines()
    assert proc.returncode == 0, "\n".join(lines[-40:])
    [outcome] = [line.removeprefix(OUTCOME) for line in lines if line.startswith(OUTCOME)]
    return json.loads(outcome), [line for line in lines if "aotc guard:" in line]


@pytest.mark.slow
@pytest.mark.full
def test_guard_on_the_cpu_twin(tmp_path):
    entry = demo_entry()
    # both engines at once: each spends most of its time in single-threaded XLA compiles
    matching = start_twin(tmp_path, "matching", entry, "1")
    other = start_twin(tmp_path, "other", replace(entry, max_num_seqs=16), "strict")

    outcome, lines = finish(*matching)
    assert outcome["raised"] is None and "error" not in outcome["finish_reasons"]
    assert any("matches this engine" in line for line in lines), lines
    # the cache holds only a manifest: the mixed greedy+random batch is a graph it does not cover
    [compiled] = [line for line in lines if "compiled after ready" in line]
    assert "PersistentCacheMiss +1" in compiled and "sampling=greedy+random" in compiled
    assert "a variant capture_model does not trace" in compiled

    outcome, lines = finish(*other)
    assert any("built for another engine" in line and "max_num_seqs: here 8, published 16" in line
               for line in lines), lines
    # strict: the batch that compiled finishes with vLLM's per-request error; the engine does not die
    assert outcome["raised"] is None and set(outcome["finish_reasons"]) == {"error"}, outcome
    assert any("AOTC_GUARD=strict: failing request(s)" in line for line in lines), lines


def test_metrics_join_whichever_registry_vllms_route_builds(tmp_path, monkeypatch):
    """vLLM's /metrics asks get_prometheus_registry(): the default registry, or with --api-server-count > 1
    a new multiprocess one; the guard's collector joins each registry once."""
    from prometheus_client import CollectorRegistry, generate_latest

    monkeypatch.setenv(guard_metrics.METRICS_DIR_ENV, str(tmp_path))
    guard_metrics.publish(guard_metrics.Figures(runner="vllm-tpu", compiles_at_startup=7), str(tmp_path))
    shared = CollectorRegistry()
    route = SimpleNamespace(get_prometheus_registry=lambda: shared)
    guard_metrics.serve_on_vllm_metrics(route)
    guard_metrics.serve_on_vllm_metrics(route)  # plugins load more than once
    assert route.get_prometheus_registry() is route.get_prometheus_registry() is shared
    assert "aotc_compiles_at_startup_total 7.0" in generate_latest(shared).decode()


# --- in the pod: the plugin load and /metrics never fail a server -----------------------------------

SCRAPE = """
from fastapi import FastAPI
from starlette.testclient import TestClient
from vllm.entrypoints.serve.instrumentator.metrics import attach_router
app = FastAPI()
attach_router(app)
for _ in range(2):
    response = TestClient(app).get('/metrics')
    print('SCRAPE', response.status_code, flush=True)
print(response.text)
"""


def load_the_plugin(env: dict[str, str], before: str = "", after: str = SCRAPE) -> subprocess.CompletedProcess:
    """vLLM's own general-plugin load (what every `vllm serve` process does), then two scrapes of vLLM's own
    /metrics route (its ASGI app, in process), in a real process; prints SERVING if it got that far."""
    code = f"from vllm.plugins import load_general_plugins\n{before}\nload_general_plugins()\n{after}\nprint('SERVING')"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AOTC_GUARD")} | env
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, cwd=REPO,
                          timeout=300)


def guard_warnings(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if "WARNING" in line and "aotc guard:" in line]


def test_a_pod_without_a_writable_temp_dir_still_serves_and_says_why():
    """A read-only root filesystem: once vLLM is imported (its own import needs a temp dir, here it had one),
    no file may grow (RLIMIT_FSIZE 0), so tempfile finds no usable dir, as under readOnlyRootFilesystem."""
    no_temp_dir = "import resource, tempfile\nresource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))\ntempfile.tempdir = None"
    proc = load_the_plugin({"AOTC_GUARD": "1"}, before=no_temp_dir)
    assert proc.returncode == 0 and "SERVING" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.count("SCRAPE 200") == 2  # vLLM's own metrics still served
    [warning] = guard_warnings(proc)
    assert "cannot create a metrics dir" in warning and guard_metrics.METRICS_DIR_ENV in warning, warning


def test_unreadable_snapshots_are_skipped_and_vllms_metrics_still_served(tmp_path):
    good = guard_metrics.Figures(runner="vllm-tpu", compiles_at_startup=3)
    guard_metrics.publish(good, str(tmp_path))  # this (live) process's snapshot
    newer = {**dataclasses.asdict(good), "compiles_by_shape": {}}  # a newer aotc's format
    (tmp_path / "aotc-guard-1.json").write_text(json.dumps(newer))
    wrong_kinds = {**dataclasses.asdict(good), "compiles_after_ready": [1], "ready": "yes"}
    (tmp_path / f"aotc-guard-{os.getppid()}.json").write_text(json.dumps(wrong_kinds))
    (tmp_path / "aotc-guard-stray.json").write_text("left by hand")
    with subprocess.Popen(["sleep", "300"]) as sleeper:
        os.mkfifo(tmp_path / f"aotc-guard-{sleeper.pid}.json")  # a FIFO: opening it would wait forever
        try:
            proc = load_the_plugin({"AOTC_GUARD": "1", guard_metrics.METRICS_DIR_ENV: str(tmp_path)})
        finally:
            sleeper.kill()
    assert proc.returncode == 0 and proc.stdout.count("SCRAPE 200") == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "aotc_compiles_at_startup_total 3.0" in proc.stdout and "python_info" in proc.stdout
    warnings = guard_warnings(proc)  # one per unreadable file, over two scrapes
    assert len(warnings) == 4, warnings
    for name in ("aotc-guard-1.json", f"aotc-guard-{os.getppid()}.json", "aotc-guard-stray.json",
                 f"aotc-guard-{sleeper.pid}.json"):
        assert sum(name in line for line in warnings) == 1, (name, warnings)


@pytest.mark.parametrize("value", ["stric", "disabled"])
def test_a_misspelled_guard_mode_warns_naming_the_valid_values(value):
    proc = load_the_plugin({"AOTC_GUARD": value}, after="")
    assert proc.returncode == 0 and "SERVING" in proc.stdout, proc.stderr[-3000:]
    [warning] = guard_warnings(proc)
    assert f"AOTC_GUARD={value!r} is not a valid value" in warning and "strict: strict" in warning, warning
    assert "off: 0, false, no, off or unset" in warning and "log mode" in warning, warning
