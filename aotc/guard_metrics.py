"""The guard's figures on vLLM's own ``/metrics`` (Prometheus text format), for SREs and ``aotc canary``.

The guard counts in vLLM's engine-core process; ``/metrics`` is served by the API-server process(es).
vLLM puts prometheus_client into multiprocess mode only with ``--api-server-count`` > 1 (or a
``PROMETHEUS_MULTIPROC_DIR`` the user set; vllm 0.13 and vllm-tpu 0.32 alike, ``entrypoints/cli/serve.py``),
and prometheus_client picks its value backend once, at import, which vLLM's CLI does before any plugin runs.
So the engine core cannot write prometheus_client's own files in the default single-API-server mode.
Instead it writes one small JSON snapshot per process (``aotc-guard-<pid>.json``, atomically, only when a
figure changes: at start-up, at ready, when something compiles or loads after ready) into
``$AOTC_GUARD_METRICS_DIR``, a directory the first guarded process creates and every process vLLM starts
inherits. A collector added to whichever registry vLLM's ``/metrics`` route uses (the default one, or the
multiprocess one) reads the snapshots at scrape time. Names (absent family = 0):

* ``aotc_guard_info{runner, watched, mode, cache, entry}`` 1 per engine: what is guarded and how.
* ``aotc_cache_match`` 1 if the fetched cache's manifest matches this engine, else 0 (mismatch, absent, unreadable).
* ``aotc_ready`` 1 once warm-up finished.
* ``aotc_compiles_at_startup_total`` graphs compiled before ready (cache hits excluded).
* ``aotc_compiles_after_ready_total{family}`` graphs compiled while serving; ``family`` is the first graph
  family the manifest lacks for the step's padded shape, else ``unplanned`` (a graph no family covers) or
  ``cached`` (torch_xla compiled a graph its cache holds: it cannot load its cache).
* ``aotc_cache_hits_total`` / ``aotc_cache_misses_total`` persistent-cache lookups (start-up and after).
* ``aotc_requests_failed_total`` requests ``AOTC_GUARD=strict`` failed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Any

METRICS_DIR_ENV = "AOTC_GUARD_METRICS_DIR"
SNAPSHOT_PREFIX = "aotc-guard-"
# vLLM's /metrics route module (0.13 and 0.32): it asks this module-level name for its registry.
VLLM_METRICS_ROUTE = "vllm.entrypoints.serve.instrumentator.metrics"

COMPILES_AFTER_READY = "aotc_compiles_after_ready"  # counters get "_total" in the text format
COMPILES_AT_STARTUP = "aotc_compiles_at_startup"
CACHE_HITS = "aotc_cache_hits"
CACHE_MISSES = "aotc_cache_misses"
REQUESTS_FAILED = "aotc_requests_failed"
CACHE_MATCH = "aotc_cache_match"
READY = "aotc_ready"
INFO = "aotc_guard_info"


@dataclasses.dataclass
class Figures:
    """One engine's figures (a plain record: the snapshot file is ``dataclasses.asdict`` of it)."""

    runner: str = "unknown"
    watched: bool = False
    mode: str = "log"
    cache: str = "unknown"  # match | mismatch | absent | unreadable
    entry: str = ""
    ready: bool = False
    compiles_at_startup: int = 0
    compiles_after_ready: dict[str, int] = dataclasses.field(default_factory=dict)
    cache_hits: int = 0
    cache_misses: int = 0
    requests_failed: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Figures:
        return cls(**data)  # an unknown or misspelled key fails here, not silently


def metrics_dir(environ: Any = None) -> str:
    """The snapshot directory; the first process to ask creates it and hands it down through the env."""
    environ = os.environ if environ is None else environ
    if not environ.get(METRICS_DIR_ENV):
        environ[METRICS_DIR_ENV] = tempfile.mkdtemp(prefix="aotc-guard-metrics-")
    return environ[METRICS_DIR_ENV]


def publish(figures: Figures, directory: str | None = None) -> None:
    """Write this process's snapshot atomically (rename), so a scrape never reads half a file."""
    directory = directory or metrics_dir()
    path = os.path.join(directory, f"{SNAPSHOT_PREFIX}{os.getpid()}.json")
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(dataclasses.asdict(figures), f)
    os.replace(tmp, path)


def read_snapshots(directory: str) -> list[Figures]:
    """Every live engine's figures; snapshots of processes that are gone are skipped."""
    found = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    for name in names:
        if not (name.startswith(SNAPSHOT_PREFIX) and name.endswith(".json")):
            continue
        pid = int(name[len(SNAPSHOT_PREFIX):-len(".json")])
        if not _alive(pid):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                found.append(Figures.from_dict(json.load(f)))
        except (OSError, ValueError):
            continue  # replaced between listdir and open: the next scrape reads it
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class GuardCollector:
    """A prometheus_client collector over the engines' snapshots (``collect()`` runs at each scrape)."""

    def __init__(self, directory: str):
        self.directory = directory

    def describe(self):  # no up-front description: registering must not read the files
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        engines = read_snapshots(self.directory)
        info = GaugeMetricFamily(INFO, "aotc guard: the runner, whether it is watched, the mode and the cache check",
                                 labels=["runner", "watched", "mode", "cache", "entry"])
        match = GaugeMetricFamily(CACHE_MATCH, "1 if the fetched cache's manifest matches this engine, else 0")
        ready = GaugeMetricFamily(READY, "1 once the engine finished warm-up")
        startup = CounterMetricFamily(COMPILES_AT_STARTUP, "graphs compiled before ready (cache hits excluded)")
        after = CounterMetricFamily(COMPILES_AFTER_READY, "graphs compiled after ready, by the family the cache lacks",
                                    labels=["family"])
        hits = CounterMetricFamily(CACHE_HITS, "persistent compilation cache hits")
        misses = CounterMetricFamily(CACHE_MISSES, "persistent compilation cache misses")
        failed = CounterMetricFamily(REQUESTS_FAILED, "requests failed by AOTC_GUARD=strict")
        families: dict[str, int] = {}
        for e in engines:
            info.add_metric([e.runner, str(e.watched).lower(), e.mode, e.cache, e.entry], 1)
            for family, count in e.compiles_after_ready.items():
                families[family] = families.get(family, 0) + count
        if engines:
            match.add_metric([], min(int(e.cache == "match") for e in engines))
            ready.add_metric([], min(int(e.ready) for e in engines))
            startup.add_metric([], sum(e.compiles_at_startup for e in engines))
            hits.add_metric([], sum(e.cache_hits for e in engines))
            misses.add_metric([], sum(e.cache_misses for e in engines))
            failed.add_metric([], sum(e.requests_failed for e in engines))
        for family, count in sorted(families.items()):
            after.add_metric([family], count)
        yield from (info, match, ready, startup, after, hits, misses, failed)


_served: set[int] = set()


def serve_on_vllm_metrics(module: Any) -> None:
    """Make vLLM's /metrics route include the guard's collector, whichever registry it picks."""
    original = module.get_prometheus_registry
    if getattr(original, "_aotc_guard", False):
        return
    collector = GuardCollector(metrics_dir())

    def get_prometheus_registry():
        registry = original()
        if id(registry) not in _served:  # once per registry: prometheus_client rejects a second register
            _served.add(id(registry))
            registry.register(collector)
        return registry

    get_prometheus_registry._aotc_guard = True  # type: ignore[attr-defined]
    module.get_prometheus_registry = get_prometheus_registry
