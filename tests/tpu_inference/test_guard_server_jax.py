"""The guard inside a stock `vllm serve` on tpu-inference (CPU twin): API server + engine-core process, real HTTP.

Only the TPU is a stand-in (the twin). The cache dir holds the entry's manifest (its planned graphs) but no
cache entries: every graph compiles at start-up, and the first request compiles graphs outside the plan.
"""

from __future__ import annotations

import pytest

from aotc.fingerprint import fingerprint_entry
from aotc.manifest import GraphRecord, Manifest
from aotc.matrix import Entry, load_matrix
from aotc.plan import plan_entry
from aotc.processes import free_port
from aotc.server import Server, serve_command
from tests.conftest import CONFIGS
from aotc.testing import stock_server


def write_manifest(cache, entry: Entry, environ) -> Manifest:
    fp = fingerprint_entry(entry, environ)
    manifest = Manifest(entry=entry.name, fingerprint=fp.digest, inputs=fp.inputs, created="2025-01-01T00:00:00+00:00",
                        aotc_version="0.1.0", runner=entry.runner, device=entry.device,
                        graphs=tuple(GraphRecord(g.family, g.shape_dict) for g in plan_entry(entry).graphs))
    manifest.save(cache)
    return manifest


@pytest.mark.slow
def test_strict_guard_fails_the_request_that_compiled_and_keeps_serving(tmp_path, jax_env):
    entry = load_matrix(CONFIGS / "demo-jax.yaml").entries[0]
    cache = tmp_path / "cache"
    cache.mkdir()
    manifest = write_manifest(cache, entry, stock_server.server_environ(entry, cache, "strict", jax_env))
    server = stock_server.start(entry, cache, tmp_path / "server.log", "strict", jax_env)
    try:
        server.wait_ready()
        lines = stock_server.guard_lines(server)
        assert any("matches this engine" in line and manifest.entry in line for line in lines), lines
        ready = stock_server.metrics(server)
        assert stock_server.samples(ready, "aotc_cache_match") == {"": 1.0}
        assert stock_server.samples(ready, "aotc_ready") == {"": 1.0}
        assert stock_server.samples(ready, "aotc_compiles_at_startup_total")[""] > 0  # nothing cached
        assert stock_server.samples(ready, "aotc_compiles_after_ready_total") == {}
        info = stock_server.samples(ready, "aotc_guard_info")
        assert list(info) == [f'cache="match",entry="{manifest.entry}",mode="strict",runner="tpu-inference",'
                              'watched="true"']

        status, body = stock_server.complete(server, [5, 6, 7], temperature=0.8, max_tokens=4)
        assert status == 500, body  # vLLM's per-request error: FinishReason.ERROR
        failing = [line for line in stock_server.guard_lines(server) if "compiled after ready" in line]
        assert failing and all("compiled jit(" in line for line in failing), failing
        # every family the step runs is in the manifest (from the plan): the graphs lie outside it
        assert all("a graph outside tpu-inference's capture_model" in line for line in failing), failing
        assert any("AOTC_GUARD=strict: failing request(s)" in line for line in stock_server.guard_lines(server))

        # the server keeps serving: once the graphs exist in memory the same request succeeds
        for _ in range(4):
            status, body = stock_server.complete(server, [5, 6, 7], temperature=0.8, max_tokens=4)
            if status == 200:
                break
        assert status == 200, body
        assert body["usage"]["completion_tokens"] == 4
        assert stock_server.get(server.command.url + "/health")[0] == 200

        after = stock_server.metrics(server)
        assert stock_server.samples(after, "aotc_compiles_after_ready_total")['family="unplanned"'] >= len(failing)
        assert stock_server.samples(after, "aotc_requests_failed_total")[""] >= 1
    finally:
        server.stop()


@pytest.mark.slow
def test_metrics_in_vllms_multiprocess_mode(tmp_path, jax_env):
    """`--api-server-count 2`: vLLM's API-server processes load no plugins and read PROMETHEUS_MULTIPROC_DIR;
    the guard's figures reach /metrics through vLLM's own MultiProcessCollector."""
    entry = load_matrix(CONFIGS / "demo-jax.yaml").entries[0]
    command = serve_command(entry, tmp_path / "cache", free_port(), guard="1")
    command.env.update(jax_env)
    command.argv.extend(["--api-server-count", "2"])
    with Server(command, tmp_path / "server.log").start() as server:
        server.wait_ready()
        assert stock_server.complete(server, [5, 6, 7], max_tokens=2)[0] == 200
        text = stock_server.metrics(server)
        assert stock_server.samples(text, "aotc_ready") == {"": 1.0}
        assert stock_server.samples(text, "aotc_cache_match") == {"": 0.0}  # nothing fetched
        assert stock_server.samples(text, "aotc_compiles_at_startup_total")[""] > 0
        [info] = stock_server.samples(text, "aotc_guard_info")
        assert 'cache="absent"' in info and 'runner="tpu-inference"' in info and 'watched="true"' in info
        assert "vllm:" in text  # vLLM's own metrics are still there
