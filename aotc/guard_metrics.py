"""The guard's figures on vLLM's own ``/metrics`` (Prometheus text format), for SREs and ``aotc canary``.

The guard counts in vLLM's engine-core process; ``/metrics`` is served by the API-server process(es).
vLLM puts prometheus_client into multiprocess mode only with ``--api-server-count`` > 1 (or a
``PROMETHEUS_MULTIPROC_DIR`` the user set; vLLM 0.13 and vLLM-TPU 0.32 alike, ``entrypoints/cli/serve.py``),
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
import logging
import os
import tempfile
from typing import Any

from aotc.files import read_regular_file

METRICS_DIR_ENV = "AOTC_GUARD_METRICS_DIR"
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
SNAPSHOT_PREFIX = "aotc-guard-"
SNAPSHOT_SUFFIX = ".json"
SNAPSHOT_MAX_BYTES = 1 << 16  # a snapshot is a few hundred bytes; a scrape never reads a big stray file
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
logger = logging.getLogger("vllm.aotc.guard")  # the guard's logger: vLLM's format and handler


HELP = {
    INFO: "aotc guard: the runner, whether it is watched, the mode and the cache check",
    CACHE_MATCH: "1 if the fetched cache's manifest matches this engine, else 0",
    READY: "1 once the engine finished warm-up",
    COMPILES_AT_STARTUP: "graphs compiled before ready (cache hits excluded)",
    COMPILES_AFTER_READY: "graphs compiled after ready, by the family the cache lacks",
    CACHE_HITS: "persistent compilation cache hits",
    CACHE_MISSES: "persistent compilation cache misses",
    REQUESTS_FAILED: "requests failed by AOTC_GUARD=strict",
}


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
    def from_dict(cls, data: Any) -> Figures:
        """A snapshot as ``publish`` writes it; anything else (another aotc version's fields, a value of the
        wrong kind) is a ValueError, never a figure that breaks the scrape later."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        defaults = cls()
        expected = {f.name for f in dataclasses.fields(cls)}
        if set(data) != expected:
            raise ValueError(f"fields {sorted(set(data) ^ expected)} differ (another aotc version's snapshot?)")
        for name, value in data.items():
            if not _same_kind(value, getattr(defaults, name)):
                raise ValueError(f"{name} is {value!r}")
        return cls(**data)


def _same_kind(value: Any, default: Any) -> bool:
    """``value`` has the default's type (bool and int apart); counts are ints >= 0, by family name."""
    if type(value) is not type(default):
        return False
    if isinstance(default, dict):
        return all(isinstance(k, str) and _same_kind(v, 0) for k, v in value.items())
    return not isinstance(default, int) or isinstance(default, bool) or value >= 0


def metrics_dir(environ: Any = None) -> str | None:
    """The snapshot directory; the first process to ask creates it and hands it down through the env. None
    when there is no writable temp dir (a read-only root filesystem): the figures are not published, the
    guard still checks and logs, and the server serves."""
    environ = os.environ if environ is None else environ
    if not environ.get(METRICS_DIR_ENV):
        try:
            environ[METRICS_DIR_ENV] = tempfile.mkdtemp(prefix="aotc-guard-metrics-")
        except OSError as exc:
            _warn_once("no metrics dir", f"cannot create a metrics dir ({exc.strerror or exc}): the guard's figures "
                                         f"are not on /metrics; set {METRICS_DIR_ENV} (or TMPDIR) to a writable "
                                         "directory, e.g. an emptyDir")
            return None
    return environ[METRICS_DIR_ENV]


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning("aotc guard: %s", message)


def publish(figures: Figures, directory: str | None = None) -> None:
    """Write this process's snapshot atomically (rename), so a scrape never reads half a file.

    In vLLM's multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set before the engine core starts) the API-server
    processes vLLM starts load no plugins, so the figures go where vLLM's own MultiProcessCollector reads.
    """
    if os.environ.get(MULTIPROC_DIR_ENV) and directory is None:
        return publish_multiprocess(figures, os.environ[MULTIPROC_DIR_ENV])
    directory = directory or metrics_dir()
    if directory is None:
        return  # no writable dir: metrics_dir warned
    path = os.path.join(directory, f"{SNAPSHOT_PREFIX}{os.getpid()}{SNAPSHOT_SUFFIX}")
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(dataclasses.asdict(figures), f)
    os.replace(tmp, path)


def publish_multiprocess(figures: Figures, directory: str) -> None:
    """prometheus_client's own per-process files, named apart from the ones its library writes for this pid."""
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    pid, f = os.getpid(), figures
    counters = [(COMPILES_AT_STARTUP, {}, f.compiles_at_startup), (CACHE_HITS, {}, f.cache_hits),
                (CACHE_MISSES, {}, f.cache_misses), (REQUESTS_FAILED, {}, f.requests_failed),
                *((COMPILES_AFTER_READY, {"family": fam}, n) for fam, n in f.compiles_after_ready.items())]
    files = {f"counter_aotcguard{pid}.db": [(name, f"{name}_total", labels, value) for name, labels, value in counters],
             f"gauge_min_aotcguard{pid}.db": [(CACHE_MATCH, CACHE_MATCH, {}, int(f.cache == "match")),
                                               (READY, READY, {}, int(f.ready))],
             f"gauge_max_aotcguard{pid}.db": [(INFO, INFO, {"runner": f.runner, "watched": str(f.watched).lower(),
                                                              "mode": f.mode, "cache": f.cache, "entry": f.entry}, 1)]}
    for filename, rows in files.items():
        mmap = MmapedDict(os.path.join(directory, filename))
        try:
            for metric, sample, labels, value in rows:
                mmap.write_value(mmap_key(metric, sample, list(labels), list(labels.values()), HELP[metric]),
                                 float(value), 0.0)
        finally:
            mmap.close()


def read_snapshots(directory: str) -> list[Figures]:
    """Every live engine's figures; snapshots of processes that are gone are skipped, and so is (with one
    warning per file) whatever cannot be read as one: a stray file, another version's format, a FIFO. A
    scrape of vLLM's /metrics must never fail for a file in this dir."""
    found = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    for name in names:
        if not (name.startswith(SNAPSHOT_PREFIX) and name.endswith(SNAPSHOT_SUFFIX)):
            continue
        path = os.path.join(directory, name)
        pid = name[len(SNAPSHOT_PREFIX):-len(SNAPSHOT_SUFFIX)]
        if not (pid.isdigit() and pid.isascii()):
            _warn_once(path, f"skipping {path} on /metrics: not a snapshot name ({SNAPSHOT_PREFIX}<pid>{SNAPSHOT_SUFFIX})")
            continue
        if not _alive(int(pid)):
            continue
        try:
            # never through a link, never waiting on a FIFO or a device, never a big stray file
            snapshot = read_regular_file(path, SNAPSHOT_MAX_BYTES, follow_links=False)
            found.append(Figures.from_dict(json.loads(snapshot)))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, RecursionError) as exc:
            _warn_once(path, f"skipping {path} on /metrics: not a snapshot this aotc can read ({exc})")
    return found


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False  # 0 would ask about this process group
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
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
        info = GaugeMetricFamily(INFO, HELP[INFO], labels=["runner", "watched", "mode", "cache", "entry"])
        match, ready = GaugeMetricFamily(CACHE_MATCH, HELP[CACHE_MATCH]), GaugeMetricFamily(READY, HELP[READY])
        startup = CounterMetricFamily(COMPILES_AT_STARTUP, HELP[COMPILES_AT_STARTUP])
        after = CounterMetricFamily(COMPILES_AFTER_READY, HELP[COMPILES_AFTER_READY], labels=["family"])
        hits, misses = CounterMetricFamily(CACHE_HITS, HELP[CACHE_HITS]), CounterMetricFamily(CACHE_MISSES, HELP[CACHE_MISSES])
        failed = CounterMetricFamily(REQUESTS_FAILED, HELP[REQUESTS_FAILED])
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
    if getattr(original, "_aotc_guard", False) or os.environ.get(MULTIPROC_DIR_ENV):
        return  # multiprocess mode: vLLM's MultiProcessCollector reads what publish_multiprocess wrote
    directory = metrics_dir()
    if directory is None:
        return  # no writable dir: nothing is published (metrics_dir warned)
    collector = GuardCollector(directory)

    def get_prometheus_registry():
        registry = original()
        if id(registry) not in _served:  # once per registry: prometheus_client rejects a second register
            _served.add(id(registry))
            registry.register(collector)
        return registry

    get_prometheus_registry._aotc_guard = True  # type: ignore[attr-defined]
    module.get_prometheus_registry = get_prometheus_registry
