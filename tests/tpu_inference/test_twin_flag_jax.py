"""AOTC_CPU_TWIN is the one flag of both runners' CPU twins: in the JAX venv, where the vllm-tpu runner's
platform plugin is installed too (one aotc package), it must leave vLLM's platform to tpu-inference."""

from __future__ import annotations

import subprocess

from .conftest import PYTHON_ENV

RESOLVED = "from vllm.platforms import current_platform as p; print(type(p).__module__ + '.' + type(p).__name__)"


def test_the_shared_twin_flag_leaves_the_other_runners_platform_inert(jax_env):
    env = {**jax_env, "AOTC_CPU_TWIN": "1", "JAX_PLATFORMS": "cpu", "TPU_ACCELERATOR_TYPE": "v6e-1"}
    out = subprocess.run([jax_env[PYTHON_ENV], "-c", RESOLVED], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not out.stdout.strip().splitlines()[-1].startswith("aotc.")
