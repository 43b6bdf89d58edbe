"""An entry without num_gpu_blocks_override gets the KV block count vLLM 0.13's own TPU sizing gives it: the
worker's determine_available_memory (its profiling pass; on the twin torch_xla reports the twin's stated HBM
with the weights in use) and vLLM's get_kv_cache_configs, never a rule of aotc's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from aotc.fingerprint import entry_kv_blocks
from aotc.matrix import load_matrix
from aotc.runners.paddings import full_length_blocks, page_size
from aotc.runners.vllm_tpu import kv_sizer

from .conftest import REPO

FACTS = REPO / "tests" / "helpers" / "kv_facts.py"
HALF = kv_sizer.DEFAULT_HBM_BYTES // 2


@pytest.mark.slow
def test_unpinned_block_count_is_vllms_sizing_of_the_twins_hbm():
    entry = load_matrix(REPO / "configs" / "demo.yaml").entries[0]
    request = {"runner": "vllm-tpu", "entry": entry.to_dict(), "hbm_bytes": [kv_sizer.DEFAULT_HBM_BYTES, HALF]}
    proc = subprocess.run([sys.executable, str(FACTS)], input=json.dumps(request), capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    stack = {int(hbm): blocks for hbm, blocks in facts["by_hbm"].items()}
    sized = entry_kv_blocks(entry, dict(os.environ))
    assert sized == facts["sized"] == stack[kv_sizer.DEFAULT_HBM_BYTES]
    smaller = entry_kv_blocks(entry, {**os.environ, kv_sizer.HBM_BYTES_ENV: str(HALF)})
    assert smaller == stack[HALF] < sized
    # the twin's HBM holds more than every sequence at full length (the count pinned before the stack sized it)
    assert sized > full_length_blocks(entry.max_num_seqs, entry.max_model_len, page_size(entry.max_model_len))
