"""device: tpu up to the device boundary, and the CPU twin's opt-in plumbing.

Tests named *_mocked_tpu_* replace the TPU (vllm.LLM or TPUWorker.init_device)
with a stand-in; nothing here needs a TPU or compiles a graph.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest

from aotc.fingerprint import entry_kv_blocks, pin_kv
from aotc.matrix import Entry
from aotc.runners.vllm_tpu import engine
from aotc.runners.vllm_tpu.twin import plugin as twin_plugin

from .conftest import REPO, demo_entry


def entry_of(**changes) -> Entry:
    """The demo entry as a runner receives it (``Request.entry``), with ``changes``."""
    return Entry.from_dict({**demo_entry(), **changes})


def tpu_entry(**changes) -> Entry:
    return entry_of(device="tpu", accelerator="v6e-8", **changes)


def test_platform_plugin_is_declared_for_vllm():
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.platform_plugins")}
    assert plugins.get("aotc_cpu_tpu") == "aotc.runners.vllm_tpu.twin.plugin:register"


def test_platform_plugin_is_inert_unless_aotc_asks(monkeypatch):
    monkeypatch.delenv("AOTC_CPU_TWIN", raising=False)
    assert twin_plugin.register() is None
    monkeypatch.setenv("AOTC_CPU_TWIN", "1")
    assert twin_plugin.register() == "aotc.runners.vllm_tpu.twin.platform.CpuTwinTpuPlatform"


def test_importing_the_runner_package_stays_light():
    code = "import sys, aotc.runners.vllm_tpu, aotc.runners.vllm_tpu.twin.plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def resolved_platform(env: dict) -> str:
    code = "from vllm.platforms import current_platform as p; print(type(p).__module__ + '.' + type(p).__name__)"
    full_env = {k: v for k, v in os.environ.items() if k != "AOTC_CPU_TWIN"} | env
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_vllm_resolves_the_twin_only_when_asked():
    assert resolved_platform({"AOTC_CPU_TWIN": "1"}) == "aotc.runners.vllm_tpu.twin.platform.CpuTwinTpuPlatform"
    # libtpu is installed here, so vLLM's own detection picks its TPU platform.
    assert resolved_platform({}) == "vllm.platforms.tpu.TpuPlatform"


def test_the_shared_twin_flag_leaves_the_other_runners_twin_inert():
    # AOTC_CPU_TWIN asks for this venv's twin; tpu-inference's plugin is installed here too and must not act.
    code = ("import sys; from vllm.plugins import load_general_plugins; load_general_plugins(); "
            "print('aotc.runners.tpu_inference.twin' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "AOTC_CPU_TWIN": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_tpu_env_points_vllm_at_staging_and_disables_twin_mocked_tpu(tmp_path):
    env = engine.runtime_env(tpu_entry(), str(tmp_path))
    assert env["VLLM_XLA_CACHE_PATH"] == str(tmp_path)
    assert env["AOTC_CPU_TWIN"] is None  # unset, even if the caller's environment had it
    assert "PJRT_DEVICE" not in env  # vLLM's TPUWorker sets PJRT_DEVICE=TPU itself
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_cpu_env_selects_twin_on_pjrt_cpu(tmp_path):
    env = engine.runtime_env(entry_of(), str(tmp_path))
    assert env["AOTC_CPU_TWIN"] == "1" and env["PJRT_DEVICE"] == "CPU"
    assert env["AOTC_TWIN_DEVICE_NAME"] == "TPU V6E"


def test_engine_args_pick_worker_per_device():
    assert engine.engine_args(tpu_entry(), 0)["worker_cls"] == "aotc.runners.vllm_tpu.worker.AotcTPUWorker"
    args = engine.engine_args(pin_kv(entry_of()), 3)
    assert args["worker_cls"] == "aotc.runners.vllm_tpu.worker.CpuTwinWorker"
    assert args["load_format"] == "dummy" and args["seed"] == 3 and args["block_size"] == 16
    # the KV block count the core pins (the stack's sizing of the twin's HBM) reaches the engine
    assert args["num_gpu_blocks_override"] == entry_kv_blocks(entry_of())


def test_start_engine_mocked_tpu_starts_vllm_with_tpu_worker_and_cache(tmp_path, monkeypatch):
    seen = {}

    class FakeLLM:  # stands in for vllm.LLM on a TPU host
        def __init__(self, **kwargs):
            seen.update(kwargs=kwargs, env=dict(os.environ))

    import vllm

    # only LLM is a stand-in: which arguments LLM(...) takes is vLLM's own EngineArgs
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM, EngineArgs=vllm.EngineArgs))
    monkeypatch.setenv("AOTC_CPU_TWIN", "1")
    for var in ("VLLM_XLA_CACHE_PATH", "VLLM_ENABLE_V1_MULTIPROCESSING", "PJRT_DEVICE"):
        monkeypatch.setenv(var, os.environ.get(var, ""))  # restored after the test
    monkeypatch.delenv("PJRT_DEVICE")

    engine.start_engine(tpu_entry(), str(tmp_path), seed=0)

    assert seen["kwargs"]["worker_cls"] == engine.TPU_WORKER
    assert seen["env"]["VLLM_XLA_CACHE_PATH"] == str(tmp_path)
    assert "AOTC_CPU_TWIN" not in seen["env"] and "PJRT_DEVICE" not in seen["env"]


def test_tpu_worker_watches_vllms_per_rank_dir_mocked_tpu(tmp_path, monkeypatch):
    # the full stack is the test venv's (CI installs it): a missing torch_xla fails, never skips
    import aotc.runners.vllm_tpu.worker as worker_mod
    import torch_xla.runtime as xr
    from vllm.v1.worker.tpu_worker import TPUWorker

    monkeypatch.setenv("VLLM_XLA_CACHE_PATH", str(tmp_path))
    monkeypatch.setattr(TPUWorker, "init_device", lambda self: None)  # the TPU part
    monkeypatch.setattr(xr, "global_ordinal", lambda: 3)
    worker = object.__new__(worker_mod.AotcTPUWorker)
    worker.parallel_config = SimpleNamespace(world_size=4)
    worker.rank = 3

    worker.init_device()

    assert worker.probe.subdir == "tp4_rank3"  # vLLM's own per-rank layout
    (tmp_path / "tp4_rank3" / "123").write_bytes(b"x")
    with worker.probe.window("call", "backbone", {"num_tokens": 16}):
        (tmp_path / "tp4_rank3" / "456").write_bytes(b"y")
    assert worker.probe.records[-1].written == ("tp4_rank3/456",)


def test_cpu_twin_refuses_tensor_parallel(tmp_path):
    with pytest.raises(ValueError, match="tensor_parallel_size 1"):
        engine.runtime_env(entry_of(tensor_parallel_size=2), str(tmp_path))
    engine.runtime_env(tpu_entry(tensor_parallel_size=8), str(tmp_path))  # fine on a TPU


# What vLLM 0.13 runs on a TPU and the twin replaces: the Pallas attention backend and its KV update, the
# MoE and LoRA kernels, int8 matmuls, the runner and worker, and torch_xla's kernels they call.
TPU_PATH_ROOTS = (
    "vllm.v1.attention.backends.pallas", "vllm.attention.ops.pallas_kv_cache_update",
    "vllm.model_executor.layers.fused_moe.moe_pallas", "vllm.lora.ops.xla_ops.lora_ops",
    "vllm.lora.punica_wrapper.punica_tpu", "vllm.model_executor.layers.quantization.tpu_int8",
    "vllm.v1.worker.tpu_model_runner", "vllm.v1.worker.tpu_worker", "torch_xla.experimental.custom_kernel",
    "torch_xla.experimental.pallas_kernels.*",
    # torch_xla's gmm (MoE) and int8 matmul reach JAX through the torchax it bundles, behind an ImportError guard
    # (maybe_get_torchax): a missing dependency of torchax (flax) would pass silently without this root
    "torchax",
)


def test_every_module_the_tpu_path_imports_is_installed():
    """Imports, in this (the locked) venv, every module vLLM's TPU path imports on a TPU, including those its
    kernels import inside the call (jax, via torch_xla's `pallas` extra)."""
    helper = REPO / "tests" / "helpers" / "tpu_imports.py"
    # vLLM 0.13 switches to tpu_inference only where it is installed: that is the other runner's stack
    request = {"roots": TPU_PATH_ROOTS, "absent": ["tpu_inference"]}
    out = subprocess.run([sys.executable, str(helper)], input=json.dumps(request), capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["failed"] == {}
    assert {"jax", "jax.experimental.pallas.ops.tpu.megablox.gmm", "torchax",
            "torch_xla.experimental.pallas_kernels.ragged_paged_attention_v2"} <= set(result["imported"])
