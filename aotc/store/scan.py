"""A scan of the whole store as frozen records; damage becomes typed warnings, never an exception."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aotc.files import checked_time, human_size, parse_time
from aotc.store import layout
from aotc.store.core import ObjectInfo

if TYPE_CHECKING:
    from aotc.manifest import Manifest
    from aotc.store.core import Store
    from aotc.store.gc import GcStrategy

DEFAULT_MIN_AGE = 3600.0  # gc never deletes a blob younger than this (defence in depth)

# StoreWarning kinds
STRAY_OBJECT = "stray_object"  # a file under objects/ that is not <2 hex>/<sha256>
DAMAGED_MANIFEST = "damaged_manifest"  # does not parse or verify: what it references is unknown
MISSING_OBJECTS = "missing_objects"  # a manifest names objects the store does not hold
DANGLING_REF = "dangling_ref"  # a ref names a fingerprint with no manifest
OBJECTS_KEPT = "objects_kept"  # gc keeps every object while a manifest is damaged


@dataclass(frozen=True)
class StoreWarning:
    kind: str
    url: str  # what it is about
    message: str

    def __str__(self) -> str:
        return f"{self.url}: {self.message}" if self.url else self.message

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "url": self.url, "message": self.message}


@dataclass(frozen=True)
class ManifestInfo:
    entry: str
    fingerprint: str
    created: str
    path: str
    file_count: int
    size: int
    objects: frozenset[str]
    missing_objects: int = 0

    @property
    def created_ts(self) -> float:
        return parse_time(self.created)

    @property
    def size_str(self) -> str:
        return human_size(self.size)

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "fingerprint": self.fingerprint, "created": self.created,
                "path": self.path, "files": self.file_count, "size": self.size,
                "objects": len(self.objects), "missing_objects": self.missing_objects}


@dataclass(frozen=True)
class EntryInfo:
    name: str
    manifests: tuple[ManifestInfo, ...]  # newest first
    ref: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ref": self.ref, "manifests": [m.to_dict() for m in self.manifests]}


@dataclass(frozen=True)
class StoreInfo:
    url: str
    entries: tuple[EntryInfo, ...]
    objects: tuple[ObjectInfo, ...]
    temp_files: tuple[tuple[str, float | None], ...]
    warnings: tuple[StoreWarning, ...]
    damaged: tuple[str, ...] = ()  # manifests that do not parse: what they reference is unknown
    scanned_at: float = field(default_factory=time.time)

    @property
    def size_on_store(self) -> int:
        return sum(o.size for o in self.objects)

    @property
    def size_on_store_str(self) -> str:
        return human_size(self.size_on_store)

    @property
    def referenced(self) -> frozenset[str]:
        return frozenset().union(*(m.objects for e in self.entries for m in e.manifests))

    def to_dict(self) -> dict[str, Any]:
        referenced = self.referenced
        return {"store": self.url, "entries": [e.to_dict() for e in self.entries],
                "objects": len(self.objects), "size_on_store": self.size_on_store,
                "unreferenced_objects": sum(o.sha256 not in referenced for o in self.objects),
                "warnings": [w.to_dict() for w in self.warnings]}

    def gc(self, keep: int = 2, min_age: float = DEFAULT_MIN_AGE) -> GcStrategy:
        from aotc.store.gc import plan_gc

        return plan_gc(self, keep, min_age)


def scan_store(store: Store) -> StoreInfo:
    warnings: list[StoreWarning] = []
    objects, strays = store.list_objects()
    temp_files = []
    for path, mtime in strays.items():
        if layout.is_temp_name(path):
            temp_files.append((path, mtime))
        else:
            warnings.append(StoreWarning(STRAY_OBJECT, store.url_of(path), "not a content-addressed object name"))
    manifests, manifest_warnings, damaged = scan_manifests(store, objects)
    warnings += manifest_warnings
    entries = []
    for name in sorted({m.entry for m in manifests} | set(_ref_names(store))):
        mine = sorted((m for m in manifests if m.entry == name),
                      key=lambda m: (m.created_ts, m.fingerprint), reverse=True)
        ref = store.read_ref(name)
        ref_fp = ref.get("fingerprint") if ref else None
        if ref_fp and ref_fp not in {m.fingerprint for m in mine}:
            warnings.append(StoreWarning(DANGLING_REF, store.url_of(store.ref_path(name)),
                                         f"names {ref_fp}, which has no manifest"))
        entries.append(EntryInfo(name, tuple(mine), ref_fp))
    return StoreInfo(store.url, tuple(entries), tuple(sorted(objects.values(), key=lambda o: o.sha256)),
                     tuple(temp_files), tuple(warnings), tuple(damaged))


def _ref_names(store: Store) -> list[str]:
    names = []
    for path in store.find(layout.REFS):
        rel = store.relative(path, layout.REFS) or ""
        if rel.endswith(".json") and "/" not in rel:
            try:
                names.append(layout.check_name(rel[: -len(".json")], "entry name"))
            except ValueError:
                continue
    return names


def scan_manifests(store: Store, objects: dict[str, ObjectInfo]
                   ) -> tuple[list[ManifestInfo], list[StoreWarning], list[str]]:
    """(manifests, warnings, damaged paths): a damaged manifest is a warning, only I/O failures raise."""
    found, damaged = store.load_manifests(sorted(store.find(layout.MANIFESTS)))
    odd = {path: reason for path, manifest, _ in found if (reason := odd_field(manifest))}
    damaged += odd.items()
    warnings = [StoreWarning(DAMAGED_MANIFEST, store.url_of(path), _strip(reason, store.url_of(path)))
                for path, reason in damaged]
    out = []
    for path, manifest, _ in found:
        if path in odd:
            continue
        shas = frozenset(f.sha256 for f in manifest.files)
        missing = sum(1 for s in shas if s not in objects)
        if missing:
            warnings.append(StoreWarning(MISSING_OBJECTS, store.url_of(path),
                                         f"{missing} referenced object(s) missing from the store"))
        out.append(ManifestInfo(manifest.entry, manifest.fingerprint, manifest.created, path,
                                len(manifest.files), manifest.total_size, shas, missing))
    return out, warnings, [path for path, _ in damaged]


def odd_field(manifest: Manifest) -> str | None:
    """Why a manifest that parsed cannot be listed as it is, or None. Its files' sizes and every string
    were checked by the parser; what is left is ``created``, which listings show and sort by."""
    if checked_time(manifest.created) is None:
        return f"created {manifest.created[:40]!r} is not an ISO-8601 time within years 1-9999"
    return None


def _strip(reason: str, url: str) -> str:
    """Messages from the parser start with the URL; the record keeps it in its own field."""
    return reason[len(url) + 2:] if reason.startswith(f"{url}: ") else reason
