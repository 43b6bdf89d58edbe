"""The guard inside a stock `vllm serve` on vllm 0.13's torch_xla TPU runner (CPU twin), real HTTP.

The twin's platform, worker and attention stand in for the TPU; the API server, the engine-core process
and the scheduler are stock vLLM. The manifest was built for another engine (max_num_seqs 16), so the guard
names the difference at start-up and /metrics says the cache does not match.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from aotc.matrix import load_matrix

from ..conftest import CONFIGS
from aotc.testing import stock_server
from ..test_guard import DEMO_ENTRY, write_manifest


@pytest.mark.slow
@pytest.mark.full
def test_guard_start_up_line_and_metrics_on_a_stock_vllm_tpu_server(tmp_path):
    entry = load_matrix(CONFIGS / "demo.yaml").entry(DEMO_ENTRY)
    cache = tmp_path / "cache"
    cache.mkdir()
    write_manifest(cache, replace(entry, max_num_seqs=16), stock_server.server_environ(entry, cache, "1"))
    server = stock_server.start(entry, cache, tmp_path / "server.log", "1")
    try:
        server.wait_ready()
        lines = stock_server.guard_lines(server)
        assert any("built for another engine" in line and "max_num_seqs: here 8, published 16" in line
                   for line in lines), lines
        assert any("ready after" in line for line in lines), lines
        status, body = stock_server.complete(server, [5, 6, 7], temperature=0.0, max_tokens=2)
        assert status == 200, body
        text = stock_server.metrics(server)
        assert stock_server.samples(text, "aotc_cache_match") == {"": 0.0}
        assert stock_server.samples(text, "aotc_compiles_at_startup_total")[""] > 0
        [info] = stock_server.samples(text, "aotc_guard_info")
        assert 'runner="vllm-tpu"' in info and 'watched="true"' in info and 'cache="mismatch"' in info
    finally:
        server.stop()
