"""aotc's vLLM plugin collapses the flags tpu-inference prepends at import (aotc/runners/flags.py) in a real
process of the JAX venv, whichever comes first: the plugin or the stack's import. The stock server's engine
core and an in-process engine are covered end to end in test_build_verify_jax.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from aotc.runners.spec import load_runner

from .conftest import run_jax

HERE = Path(__file__).parent
IMPLIED = load_runner("tpu-inference").stack_flags
LAUNCH = {"XLA_FLAGS": "--xla_dump_to=/tmp/aotc-dump", "LIBTPU_INIT_ARGS": "--xla_tpu_enable_async_collective_fusion=true"}


@pytest.mark.parametrize("order", ["hook", "vllm"])
def test_an_engine_core_ends_with_the_stacks_flags_once(jax_env, order):
    # what an API server that imported tpu-inference leaves for the engine core it starts
    inherited = {var: " ".join([*IMPLIED[var], LAUNCH[var]]) for var in IMPLIED}
    out = run_jax(jax_env, HERE / "flag_plugin.py", {"environ": inherited, "order": order})
    assert out["prepended_before_register"] is (order == "vllm")
    for var in IMPLIED:
        assert out[var].split() == [*IMPLIED[var], LAUNCH[var]], (var, out[var])
