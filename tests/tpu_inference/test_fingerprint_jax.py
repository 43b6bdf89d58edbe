"""The tpu-inference fingerprint reads versions from the JAX venv, not from the core's."""

from __future__ import annotations

import dataclasses

from aotc.fingerprint import fingerprint_entry
from aotc.matrix import load_matrix
from aotc.runners.spec import load_runner, runner_python

from .conftest import PYTHON_ENV, REPO


def demo():
    return load_matrix(REPO / "configs" / "demo-jax.yaml").entries[0]


def entry():
    """The demo with a pinned KV block count: these tests vary flags and interpreters, each of which would
    otherwise cost a KV sizing (an engine start) of its own."""
    return dataclasses.replace(demo(), engine={"num_gpu_blocks_override": 65})


def test_versions_come_from_the_runner_interpreter(jax_env):
    fp = fingerprint_entry(entry(), jax_env)
    assert fp.inputs["versions"] == {"jax": "0.11.2", "jaxlib": "0.11.2", "libtpu": "0.0.48",
                                     "tpu-inference": "0.32.0", "vllm-tpu": "0.32.0", "torchax": "0.0.13"}
    assert "XLA_FLAGS:--xla_cpu_max_isa=AVX2" in fp.inputs["xla_flags"]


def test_the_runner_interpreter_computes_the_same_digest(jax_env):
    # The guard in a stock server fingerprints the entry under the JAX venv's Python (3.12), the build's core
    # under this one: every input, the twin's code included, must come out the same.
    import json
    import subprocess

    code = ("import json, sys; from aotc.fingerprint import fingerprint_entry; from aotc.matrix import load_matrix;"
            "fp = fingerprint_entry(load_matrix(sys.argv[1]).entries[0]); print(json.dumps([fp.digest, fp.inputs]))")
    out = subprocess.run([jax_env[PYTHON_ENV], "-c", code, str(REPO / "configs" / "demo-jax.yaml")], env=jax_env,
                         capture_output=True, text=True, check=True).stdout
    there = json.loads(out.strip().splitlines()[-1])
    here = fingerprint_entry(demo(), jax_env)  # the KV block count sized once, read from disk on both sides
    assert "twin" in here.inputs
    assert there == [here.digest, here.inputs]


def test_launch_flags_still_count(jax_env):
    plain = fingerprint_entry(entry(), jax_env)
    flagged = fingerprint_entry(entry(), {**jax_env, "LIBTPU_INIT_ARGS": "--xla_tpu_enable_async_collective_fusion=true"})
    assert plain.digest != flagged.digest


def test_runner_python_defaults_to_this_interpreter(jax_env):
    import sys

    assert runner_python("tpu-inference", {}) == sys.executable
    assert runner_python("tpu-inference", jax_env) == jax_env[PYTHON_ENV]
    assert runner_python("vllm-tpu", jax_env) == sys.executable


def test_every_process_layout_has_one_fingerprint_with_the_stacks_flags_once(jax_env):
    # tpu-inference's env_override prepends its flags in the API server and again in the engine core; aotc's
    # plugin collapses them, so a server and an in-process engine hash them once (aotc/runners/flags.py)
    served = fingerprint_entry(entry(), jax_env)
    in_process = fingerprint_entry(entry(), {**jax_env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert in_process.digest == served.digest
    for var, words in load_runner("tpu-inference").stack_flags.items():
        assert all(served.inputs["xla_flags"].count(f"{var}:{w}") == 1 for w in words), served.inputs["xla_flags"]


def test_versions_without_the_runner_venv_are_the_pinned_ones(jax_env):
    # an init container with only the core's venv: the pins, not "None" (which matched nothing: exit 3)
    here = {k: v for k, v in jax_env.items() if k != PYTHON_ENV}
    assert fingerprint_entry(entry(), here).inputs["versions"] == fingerprint_entry(entry(), jax_env).inputs["versions"]
