"""Is every entry of a matrix published? (``aotc completeness CONFIG [--store URL] [--json]``)

The last step of a sharded build (configs/k8s/build-job.yaml, configs/ci/github-actions.yaml): each
shard publishes what it built, content addressing merges them, and this confirms the union. An entry
counts as published when the store holds a manifest for the fingerprint computed here, so run it in
the builders' image and environment. The CLI exits 0 when complete, 3 when something is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EntryStatus:
    entry: str
    fingerprint: str
    published: bool

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "fingerprint": self.fingerprint, "published": self.published}


@dataclass(frozen=True)
class CompletenessReport:
    config: str
    store: str
    entries: tuple[EntryStatus, ...]

    @property
    def missing(self) -> tuple[EntryStatus, ...]:
        return tuple(e for e in self.entries if not e.published)

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "config": self.config, "complete": not self.missing,
                "entries": [e.to_dict() for e in self.entries]}


def check_completeness(config: str, store_url: str | None) -> CompletenessReport:
    from aotc.fingerprint import fingerprint_entry
    from aotc.matrix import load_matrix
    from aotc.store import Store, resolve_store_url

    matrix = load_matrix(config, check_stack=False)
    store = Store.from_url(resolve_store_url(store_url, matrix.store))
    rows = []
    for entry in matrix.entries:
        digest = fingerprint_entry(entry).digest
        rows.append(EntryStatus(entry.name, digest, bool(store.fs.exists(store.manifest_path(entry.name, digest)))))
    return CompletenessReport(config, store.url, tuple(rows))
