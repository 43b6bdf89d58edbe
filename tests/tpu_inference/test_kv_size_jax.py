"""An entry without num_gpu_blocks_override gets the KV block count tpu-inference's own sizing gives it: the
worker's determine_available_memory (on the twin: its stated HBM × gpu_memory_utilization) and vLLM's
get_kv_cache_configs, never a rule of aotc's."""

from __future__ import annotations

import dataclasses

import pytest

from aotc.fingerprint import entry_kv_blocks, pin_kv
from aotc.kv import OVERRIDE
from aotc.runners.paddings import full_length_blocks
from aotc.matrix import load_matrix
from aotc.runners.paddings import page_size
from aotc.runners.tpu_inference import twin

from .conftest import REPO, run_jax

FACTS = REPO / "tests" / "helpers" / "kv_facts.py"
HALF = twin.DEFAULT_HBM_BYTES // 2


def demo():
    return load_matrix(REPO / "configs" / "demo-jax.yaml").entries[0]


@pytest.mark.slow
def test_unpinned_block_count_is_the_stacks_sizing_of_the_twins_hbm(jax_env):
    entry = demo()
    facts = run_jax(jax_env, FACTS, {"runner": "tpu-inference", "entry": entry.to_dict(),
                                     "hbm_bytes": [twin.DEFAULT_HBM_BYTES, HALF]})
    stack = {int(hbm): blocks for hbm, blocks in facts["by_hbm"].items()}
    sized = entry_kv_blocks(entry, jax_env)
    assert sized == facts["sized"] == stack[twin.DEFAULT_HBM_BYTES]
    # another HBM figure, another count: the twin's figure is what the stack sized
    smaller = entry_kv_blocks(entry, {**jax_env, twin.HBM_BYTES_ENV: str(HALF)})
    assert smaller == stack[HALF] < sized
    # the HBM fits more than every sequence at full length: the default holds at least what it used to
    assert sized >= full_length_blocks(entry.max_num_seqs, entry.max_model_len, page_size(entry.max_model_len))


def test_a_pinned_count_is_the_matrixs_and_makes_the_sized_entrys_fingerprint(jax_env):
    from aotc.fingerprint import fingerprint_entry

    entry = demo()
    pinned = dataclasses.replace(entry, engine={OVERRIDE: 33})
    assert entry_kv_blocks(pinned, {}) == 33  # never sized: no stack needed
    sized = pin_kv(entry, jax_env)  # the build's entry: the stack's count written into its engine arguments
    assert sized.engine[OVERRIDE] == entry_kv_blocks(entry, jax_env)
    assert fingerprint_entry(sized, jax_env) == fingerprint_entry(entry, jax_env)
