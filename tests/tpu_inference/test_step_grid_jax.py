"""The build's traffic sweep covers every runtime graph a server of the entry compiles, whatever the seed:
at max_num_seqs 16 (request buckets 8 and 16) tpu-inference compiles, per scheduler step, eager graphs
shaped by the padded request count *and* the padded token count (jit_split; the prompt-logprob row select),
and a sweep that reached only some pairs left verify at another seed with misses. The step grid
(aotc/runners/traffic.py: step_shapes) reaches every pair; verify at several seeds finds nothing missing."""

from __future__ import annotations

import json

import pytest

from .test_build_verify_jax import aotc
from .test_incremental_jax import built, demo

ENTRY = "tiny-llama-jax--len128-seqs16-tok64-tp1"


@pytest.mark.slow
def test_a_16_seq_build_verifies_with_zero_misses_at_several_seeds(jax_env, tmp_path):
    entry = built(aotc(jax_env, "build", demo(tmp_path, "16"), "--out", tmp_path / "out", "--traffic", "16",
                       "--json"))[0]
    assert entry["entry"] == ENTRY
    for seed in (1, 2):
        proc = aotc(jax_env, "verify", entry["artifact_dir"], "--seed", str(seed), "--traffic", "32", "--json")
        assert proc.returncode == 0, (seed, proc.stderr[-4000:])
        result = json.loads(proc.stdout)
        assert result["misses"] == 0 and result["loadable"] is True, (seed, result["missed"])
