"""The artifact store: content-addressed objects, manifests as commit markers, refs, leases, scan, gc.

Modules (docs/design.md "Store layout"):
  url        which store, and fsspec options from the environment
  layout     keys under the store root
  backends   write (and local read) semantics per kind of backend
  core       ``Store``: reads, writes, manifests (self-verifying), refs
  leases     publish/gc leases, the waiting rule, breaking a stale lease
  scan       ``scan_store`` -> ``StoreInfo`` of frozen records (damage as ``StoreWarning``), ``GcStrategy``
             (the plan) and its ``execute`` (manifests first, objects last)
  transfer   the byte meter and fail-fast parallel map publish and fetch share
  cache      a node-local object cache for fetch

The library returns data; rendering lives in the CLI layer (aotc/render.py).
"""

from aotc.files import human_size, parse_time, sha256_file
from aotc.store.core import (
    GC_LOCK_TTL,
    MANIFEST_READS,
    PUBLISH_LEASE_TTL,
    ObjectInfo,
    Store,
    parse_store_manifest,
    stored_manifest_bytes,
)
from aotc.store.layout import SHA256_HEX, check_name, is_temp_name
from aotc.store.scan import (
    DEFAULT_MIN_AGE,
    EntryInfo,
    GcReport,
    GcStrategy,
    ManifestInfo,
    StoreInfo,
    StoreWarning,
    plan_gc,
    scan_store,
)
from aotc.store.transfer import Meter, run_parallel
from aotc.store.url import (
    DEFAULT_STORE_DIR,
    ENV_STORAGE_EMULATOR,
    ENV_STORE,
    ENV_STORE_ENDPOINT,
    ENV_STORE_OPTIONS,
    resolve_store_url,
    store_options_from_env,
    unreachable,
)

__all__ = [
    "DEFAULT_MIN_AGE", "DEFAULT_STORE_DIR", "ENV_STORAGE_EMULATOR", "ENV_STORE", "ENV_STORE_ENDPOINT",
    "ENV_STORE_OPTIONS", "GC_LOCK_TTL", "MANIFEST_READS", "PUBLISH_LEASE_TTL", "SHA256_HEX", "EntryInfo",
    "GcReport", "GcStrategy", "ManifestInfo", "Meter", "ObjectInfo", "Store", "StoreInfo", "StoreWarning",
    "check_name", "human_size", "is_temp_name", "parse_store_manifest", "parse_time", "plan_gc",
    "resolve_store_url", "run_parallel", "scan_store", "sha256_file", "store_options_from_env", "stored_manifest_bytes",
    "unreachable",
]
