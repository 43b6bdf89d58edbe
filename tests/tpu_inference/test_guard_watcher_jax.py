"""The tpu-inference watcher's JAX compile counter on real JAX (CPU): compiles named with their argument
shapes, persistent-cache loads not counted as compiles."""

from __future__ import annotations

import json
import subprocess

from .conftest import jax_python

PROGRAM = """
import json, jax, jax.numpy as jnp
from aotc.runners.tpu_inference.watcher import JaxCompiles
counter = JaxCompiles(); counter.install(); counter.keep_names = True
double = jax.jit(lambda x: x * 2)
double(jnp.ones((3, 4))); double(jnp.ones((3, 4))); double(jnp.ones((5,)))
print(json.dumps({**counter.counters(), "names": counter.take_names()}))
"""


def run(env, cache):
    out = subprocess.run([str(jax_python()), "-c", PROGRAM], capture_output=True, text=True, timeout=600, check=True,
                         env={**env, "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": str(cache),
                              "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                              "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_compiles_are_named_and_cache_loads_are_not_compiles(jax_env, tmp_path):
    cold = run(jax_env, tmp_path)
    lambdas = [n for n in cold["names"] if n.startswith("jit(<lambda>)")]
    # one compile per shape; the second call with (3, 4) reuses the in-memory executable
    assert lambdas == ["jit(<lambda>)(tensor<3x4xf32>)", "jit(<lambda>)(tensor<5xf32>)"], cold
    assert cold["compiles"] == len(cold["names"])

    warm = run(jax_env, tmp_path)  # a fresh process on the cache the first one wrote
    assert warm["compiles"] == 0 and warm["names"] == [], warm
    assert warm["hits"] == cold["compiles"] and warm["misses"] == 0, (cold, warm)
