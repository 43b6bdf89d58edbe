"""Tensor parallelism on the CPU twin: a tp 4 entry runs tpu-inference's own sharded graphs on 4 virtual CPU
devices (XLA's --xla_force_host_platform_device_count, in the fingerprint), builds and verifies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aotc.fingerprint import fingerprint_entry
from aotc.matrix import parse_matrix
from aotc.plan import plan_entry

from .conftest import REPO, run_jax
from .test_build_verify_jax import aotc

MODEL = REPO / "configs" / "models" / "tiny-llama"


def matrix_text(tp: int) -> str:
    # a pinned KV block count: these tests are about the mesh, not the stack's KV sizing
    return f"""defaults: {{runner: tpu-inference, device: cpu, accelerator: v6e-4, dtype: bfloat16,
           engine: {{num_gpu_blocks_override: 65}}}}
models:
  - name: tiny-llama-jax
    model: {MODEL}
    matrix: {{max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64], tensor_parallel_size: [{tp}]}}
"""


def test_plan_and_fingerprint_name_the_mesh():
    tp1, tp4 = (parse_matrix(matrix_text(tp)).entries[0] for tp in (1, 4))
    assert plan_entry(tp4).buckets["mesh"] == {"axes": {"data": 1, "model": 4}, "devices": 4}
    inputs1, inputs4 = fingerprint_entry(tp1).inputs, fingerprint_entry(tp4).inputs
    assert inputs4["mesh"]["axes"]["model"] == 4 and inputs1["mesh"]["axes"]["model"] == 1
    assert "XLA_FLAGS:--xla_force_host_platform_device_count=4" in inputs4["xla_flags"]
    assert not any("device_count" in f for f in inputs1["xla_flags"])  # tp 1 keys stay a plain CPU process's


@pytest.mark.slow
def test_tp4_entry_builds_and_verifies_with_collectives(jax_env, tmp_path):
    config = tmp_path / "tp4.yaml"
    config.write_text(matrix_text(4))
    entry = parse_matrix(matrix_text(4)).entries[0]
    proc = aotc(jax_env, "build", config, "--out", tmp_path / "out", "--traffic", "16", "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    built = json.loads(proc.stdout)["entries"][0]
    assert built["ok"] and built["graphs_with_keys"] == built["planned"] == len(plan_entry(entry).graphs)
    artifact = Path(built["artifact_dir"])

    proc = aotc(jax_env, "verify", artifact, "--traffic", "16", "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert result["misses"] == 0 and result["loadable"] is True

    manifest = json.loads((artifact / "manifest.json").read_text())
    collectives = run_jax(jax_env, Path(__file__).with_name("hlo_collectives.py"),
                          {"cache_dir": str(artifact / "cache"), "devices": 4})
    backbone = next(g for g in manifest["graphs"] if g["family"] == "backbone")["keys"]
    # the model's row-parallel layers sum their partial results across the 4 ranks
    assert all("all-reduce" in collectives[k] for k in backbone), {k: collectives.get(k) for k in backbone}


def test_the_twins_device_flag_joins_the_environment_it_is_given_not_this_process(monkeypatch, tmp_path):
    from aotc.runners.tpu_inference.engine import runtime_env

    monkeypatch.setenv("XLA_FLAGS", "--from_this_process")
    entry = parse_matrix(matrix_text(4)).entries[0]
    flags = runtime_env(entry, str(tmp_path), environ={"XLA_FLAGS": "--from_the_launch"})["XLA_FLAGS"].split()
    assert "--xla_force_host_platform_device_count=4" in flags and "--from_the_launch" in flags
    assert "--from_this_process" not in flags
