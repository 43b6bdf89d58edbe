"""Loopback fixtures the tests and the benchmarks share: a fake GCS server (gcs_server), a latency and
fault-injecting proxy (faultproxy), synthetic artifact dirs (artifacts) and a client for a stock
`vllm serve` started by aotc/server.py (stock_server).

Development tools, not library: nothing in aotc imports this package, and its heavy or test-only
dependencies (fake-gcs-server's binary) are imported on first use. It lives in the package (as
``numpy.testing`` does) so that bench/ need not import from tests/.
"""
