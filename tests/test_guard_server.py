"""The guard inside a stock `vllm serve` on vllm 0.13's torch_xla TPU runner (CPU twin), real HTTP.

The twin's platform, worker and attention stand in for the TPU; the API server, the engine-core process
and the scheduler are stock vLLM. The manifest was built for another engine (max_num_seqs 16), so the guard
names the difference at start-up and /metrics says the cache does not match.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from aotc.matrix import Entry

from .conftest import CONFIGS
from .helpers import stock_server
from .test_guard import DEMO_ENTRY, write_manifest


@pytest.mark.slow
@pytest.mark.full
def test_guard_start_up_line_and_metrics_on_a_stock_vllm_tpu_server(tmp_path):
    entry = stock_server.entry_dict(CONFIGS / "demo.yaml", DEMO_ENTRY)
    cache = tmp_path / "cache"
    cache.mkdir()
    extra = {"AOTC_GUARD": "1"}
    published = replace(Entry.from_dict(entry), max_num_seqs=16)
    write_manifest(cache, published, stock_server.server_environ(entry, str(cache), extra))
    server = stock_server.start(entry, str(cache), tmp_path / "server.log", extra)
    try:
        server.wait_ready()
        lines = server.guard_lines()
        assert any("built for another engine" in line and "max_num_seqs: here 8, published 16" in line
                   for line in lines), lines
        assert any("ready after" in line for line in lines), lines
        status, body = server.complete([5, 6, 7], temperature=0.0, max_tokens=2)
        assert status == 200, body
        text = server.metrics()
        assert stock_server.samples(text, "aotc_cache_match") == {"": 0.0}
        assert stock_server.samples(text, "aotc_compiles_at_startup_total")[""] > 0
        [info] = stock_server.samples(text, "aotc_guard_info")
        assert 'runner="vllm-tpu"' in info and 'watched="true"' in info and 'cache="mismatch"' in info
    finally:
        server.stop()
