"""The serving guard (aotc/guard.py): cache check, compile counting, and an end-to-end run on the CPU twin."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest

from aotc import guard
from aotc.fingerprint import fingerprint_entry
from aotc.manifest import GraphRecord, Manifest
from aotc.matrix import load_matrix
from aotc.plan import plan_entry

from .conftest import CONFIGS, REPO
from .helpers.guard_engine import OUTCOME

DEMO_ENTRY = "tiny-llama--len128-seqs8-tok64-tp1"
ENV = {"AOTC_CPU_TWIN": "1", "XLA_FLAGS": "--xla_dump_to=/tmp/x", "VLLM_TPU_BUCKET_PADDING_GAP": "0"}


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
        cache_config=SimpleNamespace(cache_dtype="auto", enable_prefix_caching=True, block_size=128),
        lora_config=None,
    )


def write_manifest(cache_dir, entry, environ, graphs=()):
    fp = fingerprint_entry(entry, environ)
    Manifest(entry=entry.name, fingerprint=fp.digest, inputs=fp.inputs, created="2025-01-01T00:00:00+00:00",
             aotc_version="0.1.0", runner=entry.runner, device=entry.device, graphs=tuple(graphs)).save(cache_dir)
    return fp


# --- start-up check -------------------------------------------------------------------------------


def test_matching_manifest(tmp_path):
    entry = demo_entry()
    write_manifest(tmp_path, entry, ENV)
    check = guard.check_cache(str(tmp_path), vllm_config(entry), ENV)
    assert check.status == "match", check.line
    assert DEMO_ENTRY in check.line


def test_mismatch_names_the_differing_inputs(tmp_path):
    entry = demo_entry()
    write_manifest(tmp_path, replace(entry, max_num_seqs=16, engine={"block_size": 16}), ENV)
    check = guard.check_cache(str(tmp_path), vllm_config(entry), {**ENV, "VLLM_TPU_BUCKET_PADDING_GAP": "64"})
    assert check.status == "mismatch"
    assert [d.split(":")[0] for d in check.differences] == ["env.VLLM_TPU_BUCKET_PADDING_GAP", "max_num_seqs"]
    assert "max_num_seqs: here 8, published 16" in check.line


def test_absent_and_unreadable_manifests(tmp_path):
    entry = demo_entry()
    assert guard.check_cache(str(tmp_path / "nothing"), vllm_config(entry), ENV).status == "absent"
    (tmp_path / "manifest.json").write_text("{not json")
    assert guard.check_cache(str(tmp_path), vllm_config(entry), ENV).status == "unreadable"


def test_flags_torch_xla_appends_after_launch_do_not_count(tmp_path):
    entry = demo_entry()
    write_manifest(tmp_path, entry, ENV)
    environ = {**ENV, guard.LAUNCH_FLAGS_ENV: guard.launch_flags_record(ENV)}
    environ["XLA_FLAGS"] += " --xla_cpu_enable_fast_math=false"  # what `import torch_xla` does
    environ["LIBTPU_INIT_ARGS"] = "--xla_jf_conv_input_fusion=False"  # what TPUWorker.init_device does
    assert guard.check_cache(str(tmp_path), vllm_config(entry), environ).status == "match"


def test_unobservable_engine_args_come_from_the_manifest():
    entry = demo_entry()
    manifest = SimpleNamespace(entry=entry.name, inputs={"engine": {"block_size": 16, "kv_cache_dtype": "fp8"}})
    running = guard.running_entry(vllm_config(entry), manifest, {})
    # vLLM's TPU platform overwrote block_size (128 here); the running kv cache dtype is real
    assert running.engine == {"block_size": 16, "kv_cache_dtype": "auto"}


@pytest.mark.parametrize("value, mode", [("", None), ("0", None), ("off", None), ("1", "log"), ("STRICT", "strict")])
def test_guard_mode(value, mode):
    assert guard.guard_mode({"AOTC_GUARD": value}) == mode


def test_import_and_register_are_free_when_unset():
    code = ("import sys, aotc.guard as g; g.register(); "
            "print(sorted(m for m in ('torch', 'torch_xla', 'vllm', 'yaml', 'pydantic', 'aotc.matrix') "
            "if m in sys.modules), any(isinstance(f, g._PostImportHook) for f in sys.meta_path))")
    env = {k: v for k, v in os.environ.items() if k != "AOTC_GUARD"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["[]", "False"]


def test_register_patches_the_worker_module_when_it_is_imported(tmp_path):
    package = tmp_path / "fakevllm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "worker.py").write_text("class TPUWorker:\n" + "".join(
        f"    def {m}(self, *a): return '{m}'\n"
        for m in ("init_device", "compile_or_warm_up_model", "execute_model", "sample_tokens")))
    code = ("import aotc.guard as g; g.when_imported('fakevllm.worker', g.patch_worker); "
            "g.when_imported('fakevllm.worker', g.patch_worker); from fakevllm.worker import TPUWorker as W; "
            "print(W._aotc_guarded, W.execute_model.__wrapped__.__name__, "
            "hasattr(W.execute_model.__wrapped__, '__wrapped__'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.split() == ["True", "execute_model", "False"]  # wrapped once, not twice


# --- after warm-up --------------------------------------------------------------------------------


class FakeCounters:
    def __init__(self):
        self.values = {"UncachedCompile": 10, "PersistentCacheMiss": 3, "DynamoGraphs": 5}

    def __call__(self):
        return dict(self.values)


STEP = {"num_reqs": 16, "num_tokens": 32, "all_greedy": False, "logprobs": False}
GRAPHS = (GraphRecord("backbone", {"num_tokens": 32, "num_reqs": 8, "num_blocks": 8}),
          GraphRecord("select_hidden_states", {"num_tokens": 32, "num_reqs": 8}),
          GraphRecord("compute_logits", {"num_reqs": 16}),
          GraphRecord("sample_from_logits", {"num_reqs": 16, "all_greedy": True}))


def test_uncovered_families_names_what_the_manifest_lacks():
    assert guard.uncovered_families(GRAPHS, STEP) == ["select_hidden_states[num_tokens=32, num_reqs=16]",
                                                      "sample_from_logits[num_reqs=16, all_greedy=False]"]
    assert "gather_logprobs[num_reqs=16]" in guard.uncovered_families(GRAPHS, {**STEP, "logprobs": True})


def test_counter_delta_survives_dynamo_resets():
    assert guard.counter_delta({"a": 5, "b": 2}, {"a": 7, "b": 1}) == {"a": 2, "b": 1}


def test_cache_misses_survive_the_dynamo_bridge_clearing_counters(monkeypatch):
    raw = {"UncachedCompile": 0, "PersistentCacheMiss": 0}
    met = SimpleNamespace(counter_value=raw.get, clear_counters=lambda: raw.update(PersistentCacheMiss=0))
    monkeypatch.setattr(guard, "_banked", {})
    guard.bank_across_clears(met)
    guard.bank_across_clears(met)  # once per process, however often a worker starts
    raw.update(PersistentCacheMiss=1, UncachedCompile=1)
    met.clear_counters()
    met.clear_counters()
    assert guard._banked == {"PersistentCacheMiss": 1}  # UncachedCompile: the bridge restores it itself


def test_guard_counts_only_after_warm_up_and_logs_each_compile(caplog):
    counters = FakeCounters()
    g = guard.Guard(strict=False, rank=0, graphs=GRAPHS, counters=counters)
    counters.values["UncachedCompile"] += 5  # warm-up compiles are expected
    g.after_step("sample_tokens", lambda: STEP)
    g.warmed_up()
    g.after_step("execute_model", lambda: pytest.fail("a quiet step must not compute its shape"))
    counters.values.update(UncachedCompile=16, PersistentCacheMiss=4)
    # vLLM's logging config stops "vllm.*" records from reaching the root logger once vllm is
    # imported (as it is when other tests ran first), so listen on the guard's logger itself
    logger = logging.getLogger("vllm.aotc.guard")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="vllm.aotc.guard"):
            g.after_step("sample_tokens", lambda: STEP)
    finally:
        logger.removeHandler(caplog.handler)
    assert g.totals == {"UncachedCompile": 1, "PersistentCacheMiss": 1}
    warnings = {r.getMessage(): r for r in caplog.records if r.name == "vllm.aotc.guard" and r.levelno >= logging.WARNING}
    [record] = warnings.values()
    assert "compiled after warm-up in sample_tokens (PersistentCacheMiss +1, UncachedCompile +1)" in record.message
    assert "sample_from_logits[num_reqs=16, all_greedy=False]" in record.message


def test_strict_raises_on_a_compile_after_warm_up():
    counters = FakeCounters()
    g = guard.Guard(strict=True, rank=0, counters=counters)
    g.warmed_up()
    counters.values["DynamoGraphs"] += 1
    with pytest.raises(guard.CompiledAfterWarmUp, match="DynamoGraphs \\+1"):
        g.after_step("sample_tokens", lambda: STEP)


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
    entry_json.write_text(json.dumps({**entry.to_dict(), "model": entry.model_path}))
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
    assert outcome["raised"] is None
    assert any("matches this engine" in line for line in lines), lines
    # the cache holds only a manifest: the mixed greedy+random batch is a graph it does not cover
    [compiled] = [line for line in lines if "compiled after warm-up" in line]
    assert "PersistentCacheMiss +1" in compiled and "sampling=greedy+random" in compiled
    assert "a variant capture_model does not trace" in compiled

    outcome, lines = finish(*other)
    assert any("built for another engine" in line and "max_num_seqs: here 8, published 16" in line
               for line in lines), lines
    assert outcome["raised"] and "CompiledAfterWarmUp" in outcome["raised"]
