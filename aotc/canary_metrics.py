"""What the canary reads from the server's ``/metrics``: the guard's ``aotc_*`` series, vLLM's requests
running and its prefix-cache counters."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

# The guard's series on vLLM's /metrics (aotc/guard_metrics.py), e.g. aotc_compiles_after_ready_total{family="cached"} 1.0
GUARD_METRIC = re.compile(r"^(aotc_[a-z_]+)(\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M)


def scrape_metrics(url: str) -> str:
    """vLLM's /metrics text ("" when the server does not answer)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            return response.read().decode()
    except (urllib.error.URLError, OSError):
        return ""


def guard_series(metrics: str) -> dict[str, float] | None:
    """The guard's ``aotc_*`` series (None when this server publishes none)."""
    series = {name + (labels or ""): float(value) for name, labels, value in GUARD_METRIC.findall(metrics)}
    return series or None


def metric_sum(metrics: str, name: str) -> float | None:
    """A series of vLLM's /metrics text summed over its label sets (None when the server publishes none)."""
    values = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", metrics, re.M)
    return sum(float(v) for v in values) if values else None


def prefix_cache_counters(metrics: str) -> dict[str, float] | None:
    """vllm:prefix_cache_queries_total and _hits_total (None when absent)."""
    counters = {name: metric_sum(metrics, f"vllm:prefix_cache_{name}_total") for name in ("queries", "hits")}
    return {name: value for name, value in counters.items() if value is not None} or None
