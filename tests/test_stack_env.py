"""What the fingerprint hashes of the environment is the stack's own registry of what it reads (issue 45 #4).

Each runner's ``stack_env.READ`` is held to its stack's ``environment_variables`` (read in the runner's own
interpreter), and the variables it leaves out as vLLM's are exactly those vLLM's own compile-cache key leaves
out (``compile_factors``). Through ``aotc fingerprint`` and ``aotc plan``: a variable the stack reads changes
the digest whether or not aotc names it, and ``env:`` takes only what is hashed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from aotc.runners.spec import load_runner
from aotc.runners.stack_env import VLLM_IGNORES

from .conftest import CONFIGS, run_aotc
from .tpu_inference.conftest import jax_python

REGISTRY_SCRIPT = """
import importlib, json, logging, sys
logging.disable(logging.CRITICAL)
read = set()
for module in sys.argv[1:]:
    read |= set(importlib.import_module(module).environment_variables)
import vllm.envs
ignored = set(vllm.envs.environment_variables) - set(vllm.envs.compile_factors())
print(json.dumps({"read": sorted(read), "vllm_ignores": sorted(ignored)}))
"""
# tpu_inference asks the GCE metadata server for these at import unless they are set
OFF_TPU = {"JAX_PLATFORMS": "cpu", "TPU_ACCELERATOR_TYPE": "v6e-1", "TPU_NAME": "t", "TPU_WORKER_ID": "0"}


def stack_registry(runner: str) -> dict[str, list[str]]:
    spec = load_runner(runner)
    python = str(jax_python()) if runner == "tpu-inference" else sys.executable
    proc = subprocess.run([python, "-c", REGISTRY_SCRIPT, *spec.env_registries], capture_output=True, text=True,
                          timeout=600, env={**OFF_TPU, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("runner", ["vllm-tpu", pytest.param("tpu-inference", marks=pytest.mark.needs_jax)])
def test_every_variable_the_stack_reads_is_hashed_or_left_out_with_a_reason(runner):
    spec = load_runner(runner)
    registry = stack_registry(runner)
    assert set(spec.env_vars) | set(spec.env_unhashed) == set(registry["read"])
    assert not set(spec.env_vars) & set(spec.env_unhashed)
    assert {var for var, why in spec.env_unhashed.items() if why == VLLM_IGNORES} == set(registry["vllm_ignores"])
    assert all(spec.env_unhashed.values())
    assert set(spec.matrix_env()) <= set(spec.env_vars)  # a matrix sets only what the stack reads and is hashed


def pinned_matrix(tmp_path, runner: str, env: str = "{}") -> str:
    """One CPU-twin entry of the demo's model with its KV block count pinned (no sizing: no engine starts)."""
    path = tmp_path / f"{runner}.yaml"
    path.write_text(f"models: [{{name: m, model: {CONFIGS / 'models' / 'tiny-llama'}, runner: {runner}, device: cpu, "
                    f"accelerator: v6e-1, env: {env}, engine: {{num_gpu_blocks_override: 65}}, matrix: "
                    "{max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]}}]")
    return str(path)


ENTRY = "m--len128-seqs8-tok64-tp1"


def cli_fingerprint(config: str, **environ: str) -> dict:
    proc = run_aotc("fingerprint", config, "--entry", ENTRY, "--json", env=environ)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# Variables each stack reads that change what it compiles and aotc never named: tpu-inference's sampling
# micro-batch, MLA KV packing and MoE dispatch, vLLM's SPMD switch (tpu-inference took it under env: unhashed);
# vLLM 0.13's fused-MoE chunk size and its SPMD switch
STACK_SETTINGS = [("tpu-inference", "SAMPLING_MICROBATCH_SIZE", "4"), ("tpu-inference", "MLA_KV_PACKING_SIZE", "2"),
                  ("tpu-inference", "MOE_HIERARCHICAL_DISPATCH", "1"), ("tpu-inference", "VLLM_XLA_USE_SPMD", "1"),
                  ("vllm-tpu", "VLLM_FUSED_MOE_CHUNK_SIZE", "4096"), ("vllm-tpu", "VLLM_XLA_USE_SPMD", "1")]


def on_its_stack(params: list[tuple]) -> list:
    """The tpu-inference cases read the JAX venv (its stack's registry, its fingerprint): needs_jax."""
    return [pytest.param(*p, marks=pytest.mark.needs_jax) if p[0] == "tpu-inference" else p for p in params]


@pytest.mark.parametrize("runner, var, value", on_its_stack(STACK_SETTINGS))
def test_a_variable_the_stack_reads_changes_the_fingerprint(tmp_path, runner, var, value):
    config = pinned_matrix(tmp_path, runner)
    plain, changed = cli_fingerprint(config), cli_fingerprint(config, **{var: value})
    assert plain["fingerprint"] != changed["fingerprint"]
    assert changed["inputs"]["env"][var] == value


@pytest.mark.parametrize("runner, var", on_its_stack([("tpu-inference", "TPU_WORKER_ID"), ("vllm-tpu", "VLLM_LOGGING_LEVEL"),
                                                      ("tpu-inference", "VLLM_XLA_CACHE_PATH")]))
def test_a_variable_left_out_with_a_reason_leaves_the_fingerprint_alone(tmp_path, runner, var):
    assert var in load_runner(runner).env_unhashed
    config = pinned_matrix(tmp_path, runner)
    assert cli_fingerprint(config)["fingerprint"] == cli_fingerprint(config, **{var: "7"})["fingerprint"]


def test_env_takes_only_what_the_entrys_stack_reads_and_hashes(tmp_path):
    # vLLM-TPU 0.32 and tpu-inference never read VLLM_TPU_MOST_MODEL_LEN (vLLM 0.13's TPU runner did)
    proc = run_aotc("plan", pinned_matrix(tmp_path, "tpu-inference", "{VLLM_TPU_MOST_MODEL_LEN: 64}"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "env.VLLM_TPU_MOST_MODEL_LEN: runner tpu-inference's stack does not read it" in proc.stderr
    # vLLM 0.13's does, and the fingerprint hashes it
    assert run_aotc("plan", pinned_matrix(tmp_path, "vllm-tpu", "{VLLM_TPU_MOST_MODEL_LEN: 64}")).returncode == 0
    # read, but the plan assumes its default (a set one would change the buckets behind the plan's back); read,
    # and changing no graph
    for var, reason in [("MIN_TOKEN_BUCKET", "reads it but its plan does not follow it; a matrix sets only "),
                        ("VLLM_LOGGING_LEVEL", "reads it but it changes no graph (")]:
        proc = run_aotc("plan", pinned_matrix(tmp_path, "tpu-inference", f"{{{var}: 32}}"))
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"env.{var}: runner tpu-inference's stack {reason}" in proc.stderr
